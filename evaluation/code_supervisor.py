"""The code executor's supervisor: PID 1 of a code-exec container, it runs the host's samples one at a time.

Shipped as text, never imported: the host (evaluation/executor.py) starts the container with
``python3 -I -c BOOTSTRAP`` and writes this file to its stdin, so the command line that every process
of the container can read (``/proc/1/cmdline``) holds no code and no number. Standard library only:
any image with python3 runs it.

For each sample the host writes one JSON line ``{"secret": S, "size": N}`` and then N bytes of program.
The supervisor runs the program in a fresh ``python3 -I -c HARNESS`` (the sample), waits for it at
most ``timeout_s``, then ends every other process of the container, wipes every folder a sample can
write, and answers with one JSON line: the sample's exit status, whether it timed out, its seconds,
the start of its output, and whether the container is clean. A container that is not clean (a
process that would not die, a file that would not go, a System V IPC object left behind) ends: the
host gives the next sample a new one.

Why a sample cannot reach the supervisor, though both run as nobody:
- the supervisor is PID 1 of the container's PID namespace, and the kernel delivers to PID 1 only the
  signals it handles; it handles none (SIGINT is set back to the default), so SIGKILL and the rest
  from a sample are dropped;
- it makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``) before it reads a sample: its
  ``/proc/1/mem``, ``fd``, ``environ`` and the rest belong to root then, so no sample can read its
  memory (earlier programs, the secret), write to its stdout (the answers) or ptrace it;
- a sample gets only its own stdin (a pipe, closed by the harness), and a file for its output.
And why a sample cannot reach a later one: before the next sample starts, every process but PID 1 is
killed (``kill(-1, SIGKILL)`` from PID 1 reaches all of them and not itself) and reaped, and
``/tmp``, ``/dev/shm`` and ``/dev/mqueue`` are emptied.
"""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

#: The folders a sample can write (the root is read-only): emptied after every sample.
WRITABLE = ("/tmp", "/dev/shm", "/dev/mqueue")
PR_SET_DUMPABLE = 4
#: The container's out-of-memory kills (cgroup v2, then v1), read around each sample.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")

#: Runs one sample: reads "<secret>\\n<program>" from stdin before the program runs, points stdin at
#: /dev/null, execs the program in an empty globals dict, exits with the secret only when the
#: program's last statement (its tests) returned. It asks the kernel's out-of-memory killer to take it
#: before the supervisor. Everything it needs is bound before the sample's code runs.
HARNESS = """\
def _harness():
    import os, sys, traceback
    exit_now, print_exc = os._exit, traceback.print_exc
    try:
        with open('/proc/self/oom_score_adj', 'w') as adj:
            adj.write('1000')
    except OSError:
        pass
    data = sys.stdin.buffer.read()
    head, _, source = data.partition(b"\\n")
    secret = int(head)
    del data, head
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = 1
    try:
        exec(compile(source, "<program>", "exec"), {})
        status = secret
    except BaseException:
        try:
            print_exc()
        except BaseException:
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    exit_now(status)
_harness()
"""


def end_all_others(seconds: float = 5.0) -> bool:
    """Kill every process of the container but this one and reap them; False if some outlived ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            os.kill(-1, signal.SIGKILL)
            signalled = True
        except ProcessLookupError:
            signalled = False
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            if not signalled:
                return True
        time.sleep(0.001)
    return False


def oom_kills() -> int | None:
    for path in OOM_COUNTERS:
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)  # a sample may have taken its own folder's rights away
            for entry in os.listdir(path):
                _remove(os.path.join(path, entry))
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def wipe() -> bool:
    """Empty the writable folders; False if anything is left, or a System V IPC object exists (or may)."""
    for top in WRITABLE:
        if not os.path.isdir(top):
            continue
        for entry in os.listdir(top):
            try:
                _remove(os.path.join(top, entry))
            except OSError:
                pass
        try:
            if os.listdir(top):
                return False
        except OSError:
            return False
    return sysv_ipc_objects() == 0


def sysv_ipc_objects() -> int:
    """System V shared memory segments, message queues and semaphore sets in use in the container's IPC
    namespace (the kernel's own counters: SHM_INFO's used_ids, MSG_INFO's msgpool, SEM_INFO's semusz;
    gVisor has no /proc/sysvipc, but answers these). -1 when they cannot be read."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    info = ctypes.create_string_buffer(256)
    counts = []
    for call, command, field in ((libc.shmctl, 14, 0), (libc.msgctl, 12, 0)):
        if call(0, command, info) < 0:
            return -1
        counts.append(ctypes.c_int.from_buffer(info, 4 * field).value)
    if libc.semctl(0, 0, 19, info) < 0:
        return -1
    counts.append(ctypes.c_int.from_buffer(info, 4 * 7).value)
    return sum(counts)


def run_one(secret: int, program: bytes, timeout_s: float, output_limit: int) -> dict:
    """Run one sample and end everything it started; its answer, but for ``clean``'s wipe."""
    # Its output comes through a pipe, not a file: a sample that fills /tmp still has its traceback read.
    output_read, output_write = os.pipe()
    kept = bytearray()

    def keep_output() -> None:
        while chunk := os.read(output_read, 65536):
            kept.extend(chunk[: max(0, output_limit - len(kept))])  # the rest is read and dropped

    read_end, write_end = os.pipe()
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        try:
            os.kill(-1, signal.SIGKILL)  # the sample and all it started; reaped by end_all_others
        except ProcessLookupError:
            pass

    kills_before = oom_kills()
    started = time.monotonic()
    try:
        child = subprocess.Popen(["python3", "-I", "-c", HARNESS], stdin=read_end, stdout=output_write,
                                 stderr=output_write, cwd="/tmp", close_fds=True)
    except OSError as exc:
        for fd in (read_end, write_end, output_read, output_write):
            os.close(fd)
        return {"status": None, "timed_out": False, "seconds": 0.0, "ended": end_all_others(),
                "output": base64.b64encode(f"the sample could not start: {exc}".encode()).decode()}
    os.close(read_end)
    os.close(output_write)
    reader = threading.Thread(target=keep_output, daemon=True)
    reader.start()
    timer = threading.Timer(timeout_s, on_timeout)
    timer.start()
    try:
        data = str(secret).encode() + b"\n" + program
        while data:
            data = data[os.write(write_end, data):]
    except OSError:
        pass  # the sample ended (or was killed) before it read its program: its status says so
    finally:
        os.close(write_end)
    status = child.wait()
    seconds = time.monotonic() - started
    timer.cancel()
    timer.join()
    ended = end_all_others()
    reader.join(2.0)  # every writer is dead once ended: the pipe is at its end
    os.close(output_read)
    kills_after = oom_kills()
    return {"status": status, "timed_out": timed_out.is_set(), "seconds": round(seconds, 3), "ended": ended,
            "out_of_memory": kills_before is not None and kills_after is not None and kills_after > kills_before,
            "output": base64.b64encode(bytes(kept)).decode()}


def main() -> None:
    import ctypes

    if os.getpid() != 1:
        sys.exit("the code executor's supervisor must be PID 1 of its container (run it without --init)")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 with no handler: a sample's signals are dropped
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("the code executor's supervisor could not make itself non-dumpable")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    config = json.loads(stdin.readline())
    while True:
        header = stdin.readline()
        if not header:
            return
        job = json.loads(header)
        program = stdin.read(job["size"])
        answer = run_one(int(job["secret"]), program, float(config["timeout_s"]), int(config["output_limit"]))
        answer["clean"] = answer.pop("ended") and wipe()
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()
        if not answer["clean"]:
            return


if __name__ == "__main__":  # run by the container's bootstrap; importing it runs nothing
    main()
