"""The code executor's supervisor: PID 1 of a code-exec container, it runs the host's samples one at a time.

Shipped as text, never imported by the host: the host (evaluation/executor.py) starts the container
with ``python3 -I -c BOOTSTRAP`` and writes this file to its stdin, so the command line that every
process of the container can read (``/proc/1/cmdline``) holds no code and no number. Standard library
only: any image with python3 runs it. (Tests import it for its codec; importing it runs nothing.)

For each sample the host writes one JSON line ``{"secret": S, "size": N}`` and then N bytes of job:
JSON of the model's code (``solution``) and the benchmark's ``prelude``, ``tests`` and ``functions``
(evaluation/code_programs.py). A sample runs as two processes:

- **the model's process**: a fresh ``python3 -I -c MODEL_HARNESS``. It runs the model's code, then
  serves calls: it reads a call (a function's name and plain-valued arguments) from one pipe, calls
  the function, and writes its result (a plain value) or the exception's name to the other. Whatever
  it does, it only ever answers calls: nothing it prints, returns or exits with is an outcome.
- **the checking process**: a fork of this supervisor, so non-dumpable from its first instruction,
  and alive before the model's process starts. It runs the benchmark's prelude and tests, with each
  name in ``functions`` bound to a stand-in that calls the model's function over the pipes; it
  decodes every answer strictly (:func:`decode`: exact built-in types only, bounded in depth and
  size), so a value it compares is a real ``int``, ``float`` or ``list``, never the model's object.
  The asserts, the builtins they use and the exit status are all here. It exits with the secret
  only when the tests returned.

The supervisor waits for the checking process at most ``timeout_s``, then ends every other process of
the container, wipes every folder a sample can write, and answers with one JSON line: the checking
process's exit status, whether it timed out, its seconds, the checking process's report and the start
of the model's output, and whether the container is clean. A container that is not clean (a process
that would not die, a file that would not go, a System V IPC object left behind) ends: the host gives
the next sample a new one.

Why the model's process cannot reach the checking process or the supervisor:
- three users: the supervisor is root with five capabilities (SETUID, SETGID, KILL, FOWNER,
  DAC_OVERRIDE: the container's spec), the checking process drops to CHECKER_UID, the model's process
  to MODEL_UID (nobody) with no capability; a process of another user can be neither signalled,
  ptraced, nor read through ``/proc`` (under gVisor too, whose ``/proc`` does not honour dumpable
  between processes of one user);
- both are non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``) besides; the model's process is started only
  after the checking process exists, and gets only its own ends of the channel;
- the supervisor is PID 1 of the container's PID namespace, and the kernel delivers to PID 1 only the
  signals it handles; it handles none (SIGINT is set back to the default). The checking process
  ignores SIGINT (no KeyboardInterrupt can skip an assert);
- the model's process gets only its stdin (a pipe, closed by its harness), a pipe for its output and
  its ends of the channel.
And why a sample cannot reach a later one: before the next sample starts, every process but PID 1 is
killed (``kill(-1, SIGKILL)`` from PID 1 reaches all of them and not itself) and reaped, and
``/tmp``, ``/dev/shm`` and ``/dev/mqueue`` are emptied.
"""

import base64
import builtins
import json
import marshal
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

#: The folders a sample can write (the root is read-only): emptied after every sample.
WRITABLE = ("/tmp", "/dev/shm", "/dev/mqueue")
PR_SET_DUMPABLE = 4
#: The container's out-of-memory kills (cgroup v2, then v1), read around each sample.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
#: At most this much of the checking process's report is read back.
REPORT_LIMIT = 16 * 1024
#: The checking process's status when the model's process left the tests without answers (it did
#: not load, or closed the channel): never a secret (3 to 125).
LEFT = 2
#: The users of a sample's two processes: the model's (nobody) and the checking process's, each its
#: own, neither the supervisor's (root, with no capability but those it needs to run and end them).
MODEL_UID = 65534
CHECKER_UID = 65533
#: libc, loaded once by main (prctl).
LIBC = None

#: The channel's codec, in both processes (the model's harness carries this text too). A value
#: crosses as a JSON array ``[tag, payload...]`` (``encode``/``decode``); only these exact types,
#: subclasses refused: None, bool, int, float, complex, str, bytes, and list, tuple, dict, set,
#: frozenset of these. Calls go to the model's process as ``marshal`` frames (the checking side's
#: own plain values: the model's side reads them); replies come back as JSON lines, which the
#: checking side parses with ``json`` and checks node by node: it never unmarshals what the model
#: wrote. The model's side needs only builtin modules (``_json``, ``marshal``): no start-up cost.
CODEC = """\
from _json import encode_basestring_ascii as _quote


class NotPlain(TypeError):
    pass


class ChannelError(Exception):
    pass


MAX_DEPTH = 64
MAX_LINE = 32 * 2**20
_PLAIN = "None, bool, int, float, complex, str, bytes, and list, tuple, dict, set or frozenset of these"
_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_KINDS = {"l": list, "t": tuple, "S": set, "F": frozenset}


def encode(value, depth=0):
    if depth > MAX_DEPTH:
        raise NotPlain("a value nested more than %d deep" % MAX_DEPTH)
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", hex(value)]
    if kind is float:
        return ["f", value.hex()]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in _TAGS:
        return [_TAGS[kind], [encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    names = [c.__name__ for c in kind.__mro__[1:-1]]
    of = " (a subclass of %s)" % ", ".join(names) if names else ""
    raise NotPlain("a value of type %s%s: only %s cross between the tests and the model's code"
                   % (kind.__name__, of, _PLAIN))


def decode(node, depth=0):
    if depth > MAX_DEPTH or type(node) is not list or not node or type(node[0]) is not str:
        raise ChannelError("not a plain value")
    tag, rest = node[0], node[1:]
    try:
        if tag == "N" and not rest:
            return None
        if len(rest) == 1:
            (payload,) = rest
            if tag == "b" and type(payload) is bool:
                return payload
            if tag == "i" and type(payload) is str:
                return int(payload, 16)
            if tag == "f" and type(payload) is str:
                return float.fromhex(payload)
            if tag == "s" and type(payload) is str:
                return payload
            if tag == "y" and type(payload) is str:
                return bytes.fromhex(payload)
            if tag in _KINDS and type(payload) is list:
                return _KINDS[tag]([decode(item, depth + 1) for item in payload])
            if tag == "d" and type(payload) is list:
                pairs = {}
                for pair in payload:
                    if type(pair) is not list or len(pair) != 2:
                        raise ChannelError("not a plain value")
                    pairs[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
                return pairs
        if tag == "c" and len(rest) == 2 and type(rest[0]) is str and type(rest[1]) is str:
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    except (ValueError, TypeError, OverflowError) as exc:
        raise ChannelError("not a plain value (%s)" % exc) from None
    raise ChannelError("not a plain value (tag %r)" % tag[:20])


def to_json(node):
    \"\"\"JSON text of a frame: dicts of str keys, lists, str, bool and None (what encode makes).\"\"\"
    kind = type(node)
    if kind is str:
        return _quote(node)
    if kind is list:
        return "[" + ",".join([to_json(item) for item in node]) + "]"
    if kind is dict:
        return "{" + ",".join([_quote(k) + ":" + to_json(v) for k, v in node.items()]) + "}"
    if node is True:
        return "true"
    if node is False:
        return "false"
    if node is None:
        return "null"
    raise NotPlain("not a frame")
"""
_codec: dict = {}
exec(CODEC, _codec)  # one text for both processes: the model's harness carries it verbatim
NotPlain, ChannelError = _codec["NotPlain"], _codec["ChannelError"]
encode, decode, to_json = _codec["encode"], _codec["decode"], _codec["to_json"]
MAX_LINE = _codec["MAX_LINE"]


class Calls:
    """The checking side's end towards the model: calls, as length-prefixed ``marshal`` frames."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, call: dict) -> None:
        data = marshal.dumps(call)
        data = len(data).to_bytes(8, "big") + data
        while data:
            data = data[os.write(self.fd, data):]


class Replies:
    """The checking side's end from the model: JSON lines, parsed by ``json`` and bounded in size."""

    def __init__(self, fd: int) -> None:
        self.file = os.fdopen(fd, "rb")
        self.closed = False

    def receive(self) -> dict:
        line = self.file.readline(MAX_LINE + 1)
        if not line:
            self.closed = True
            raise ChannelError("the model's process closed the channel (it ended, or was killed)")
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise ChannelError(f"a frame of more than {MAX_LINE // 2**20} MiB")
        try:
            frame = json.loads(line)
        except (ValueError, RecursionError):
            raise ChannelError("a frame that is not JSON") from None
        if type(frame) is not dict:
            raise ChannelError("a frame that is not an object")
        return frame


#: The model's process's command: reads its harness from stdin, as the container's PID 1 reads this
#: file (evaluation/executor.py's BOOTSTRAP): every process of a container has this command line.
BOOTSTRAP = "import sys;s=sys.stdin.buffer;exec(s.read(int(s.readline())))"

#: Runs the model's code for one sample, then serves the checking process's calls. Reads
#: "<channel fds, sys.path>\\n<solution>" from stdin before the solution runs, points stdin at
#: /dev/null, execs the solution in an empty globals dict, says "ready" (or why it could not load),
#: then answers each call with the result (a plain value, and the arguments' state after the call,
#: so that the tests see a mutated argument as they would in one process) or the exception's name
#: and message. It asks the kernel's out-of-memory killer to take it before anything else. Nothing
#: it says is an outcome. Builtin modules only until the solution runs (no start-up cost).
MODEL_HARNESS = CODEC + """
def _serve():
    import marshal, os, sys
    exit_now = os._exit
    try:
        with open('/proc/self/oom_score_adj', 'w') as adj:
            adj.write('1000')
    except OSError:
        pass
    data = sys.stdin.buffer.read()
    head, _, source = data.partition(b"\\n")
    calls_fd, replies_fd, path = marshal.loads(bytes.fromhex(head.decode()))
    sys.path[:] = path  # the supervisor's, without the cost of site's start-up (-S)
    del data, head
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out, err = sys.stdout, sys.stderr

    def flush():  # what it printed is read back only if flushed before its process is ended
        for stream in (out, err, sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass

    def print_exc():
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass

    def send(frame):
        data = (to_json(frame) + "\\n").encode()
        while data:
            data = data[os.write(replies_fd, data):]

    def receive():
        head = b""
        while len(head) < 8:
            chunk = os.read(calls_fd, 8 - len(head))
            if not chunk:
                exit_now(0)  # the tests are done
            head += chunk
        size, body = int.from_bytes(head, "big"), []
        while size:
            chunk = os.read(calls_fd, min(size, 1 << 20))
            if not chunk:
                exit_now(0)
            body.append(chunk)
            size -= len(chunk)
        return marshal.loads(b"".join(body))

    program = {}
    try:
        exec(compile(source, "<program>", "exec"), program)
    except BaseException as exc:
        print_exc()
        flush()
        send({"load_error": "%s: %s" % (type(exc).__name__, str(exc)[:500])})
        exit_now(1)
    flush()
    send({"ready": True})
    while True:
        call = receive()
        try:
            name, args, kwargs = call["call"], call["args"], call["kwargs"]
            if name not in program:
                raise NameError("name %r is not defined" % name)
            result = program[name](*args, **kwargs)
            after = [encode(a) if type(a) in (list, dict, set) else None for a in args]
            reply = {"return": encode(result), "args": after}
        except NotPlain as exc:
            reply = {"refused": str(exc)}
        except BaseException as exc:
            print_exc()
            reply = {"raise": type(exc).__name__, "message": str(exc)[:2000]}
        flush()
        try:
            send(reply)
        except NotPlain as exc:
            send({"refused": str(exc)})
        except OSError:
            exit_now(0)
_serve()
"""


class ModelError(Exception):
    """The model's function raised an exception whose type is not one of Python's own."""


#: Exceptions a model's function may raise into the tests by name: Python's own, but none that
#: changes how the tests' own code flows (StopIteration ends a ``map`` early; SystemExit ends the tests).
_NOT_RAISED = {"StopIteration", "StopAsyncIteration", "GeneratorExit", "SystemExit", "KeyboardInterrupt",
               "AssertionError"}


def _exception(name, message):
    kind = getattr(builtins, name, None) if type(name) is str else None
    if (isinstance(kind, type) and issubclass(kind, Exception) and name not in _NOT_RAISED):
        return kind(message)
    return ModelError(f"{str(name)[:100]}: {message}")


class ModelFunction:
    """Stands in the tests for a function of the model's code: calls it over the channel, plain values only."""

    def __init__(self, name, calls, replies):
        self.__name__ = self.__qualname__ = name
        self._calls, self._replies = calls, replies

    def __repr__(self):
        return f"<the model's function {self.__name__}>"

    def __call__(self, *args, **kwargs):
        try:
            for value in (*args, *kwargs.values()):
                encode(value)  # plain values only, by exact type: marshal would take a subclass's base
            frame = {"call": self.__name__, "args": list(args), "kwargs": dict(kwargs)}
        except NotPlain as exc:
            raise NotPlain(f"the tests pass {exc} to {self.__name__}: it cannot cross to the model's process "
                           "(docs/sandbox.md)") from None
        try:
            self._calls.send(frame)
        except OSError:
            raise ChannelError("the model's process closed the channel (it ended, or was killed)") from None
        reply = self._replies.receive()
        if "refused" in reply:
            raise NotPlain("{} returned {}".format(self.__name__, str(reply["refused"])[:500]))
        if "raise" in reply:
            raise _exception(reply["raise"], str(reply.get("message", ""))[:2000])
        if "return" not in reply or type(reply.get("args")) is not list or len(reply["args"]) != len(args):
            raise ChannelError("a reply that is not one")
        result = decode(reply["return"])
        for arg, after in zip(args, reply["args"], strict=False):
            if after is None:
                continue
            changed = decode(after)
            if type(changed) is not type(arg):
                raise ChannelError("a reply that changes an argument's type")
            if type(arg) is list:
                arg[:] = changed
            elif type(arg) in (dict, set):
                arg.clear()
                arg.update(changed)
        return result


def check(secret, job, calls, replies):
    """The checking process: the benchmark's prelude and tests, calling the model's functions; its exit status."""
    try:
        first = replies.receive()
        if "ready" not in first:
            why = str(first.get("load_error", "no answer"))[:600]
            print(f"the model's code did not load ({why}): no test ran")
            return LEFT
        tests = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(job["prelude"], "<benchmark prelude>", "exec"), tests)
        for name in job["functions"]:
            tests[name] = ModelFunction(name, calls, replies)
        exec(compile(job["tests"], "<benchmark tests>", "exec"), tests)
        return secret
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        return LEFT if replies.closed else 1


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


class _Capped:
    """Reads a pipe to its end in a thread, keeping at most ``limit`` bytes (the rest is read and dropped)."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd, self.limit, self.kept = fd, limit, bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while chunk := os.read(self.fd, 65536):
            self.kept.extend(chunk[: max(0, self.limit - len(self.kept))])

    def text(self) -> str:
        self.thread.join(2.0)  # every writer is dead once the sample's processes are ended
        os.close(self.fd)
        return base64.b64encode(bytes(self.kept)).decode()


def _start_checker(secret: int, job: dict, calls_write: int, replies_read: int, report_write: int,
                   others: tuple[int, ...]) -> int:
    """Fork the checking process (non-dumpable, like this one); its pid. The child never returns."""
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        for fd in others:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # never the host's stream
        os.dup2(report_write, 1)
        os.dup2(report_write, 2)
        os.close(null)
        os.close(report_write)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt can skip an assert
        if os.getuid() == 0:  # its own user: none of the model's signals, /proc reads or ptrace reach it
            os.setgroups([])
            os.setresgid(CHECKER_UID, CHECKER_UID, CHECKER_UID)
            os.setresuid(CHECKER_UID, CHECKER_UID, CHECKER_UID)
        if LIBC is not None and LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            os._exit(1)
        status = check(secret, job, Calls(calls_write), Replies(replies_read))
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status)


def run_one(secret: int, job: dict, timeout_s: float, output_limit: int) -> dict:
    """Run one sample (its checking process and the model's) and end everything it started; its
    answer, but for ``clean``'s wipe."""
    # Outputs come through pipes, not files: a sample that fills /tmp still has its traceback read.
    output_read, output_write = os.pipe()
    report_read, report_write = os.pipe()
    calls_read, calls_write = os.pipe()
    replies_read, replies_write = os.pipe()
    stdin_read, stdin_write = os.pipe()
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        try:
            os.kill(-1, signal.SIGKILL)  # the sample and all it started; reaped by end_all_others
        except ProcessLookupError:
            pass

    kills_before = oom_kills()
    started = time.monotonic()
    # First the checking process (before any thread of this sample starts: it is a fork), then the
    # model's, which never sees the checking side's ends of the channel.
    checker = _start_checker(secret, job, calls_write, replies_read, report_write,
                             (output_read, output_write, report_read, calls_read, replies_write, stdin_read,
                              stdin_write))
    os.close(report_write)
    os.close(calls_write)
    os.close(replies_read)
    model = None
    try:
        # As root (the container's PID 1 holds only SETUID, SETGID, KILL, FOWNER and DAC_OVERRIDE),
        # the model's process is dropped to nobody: no capability, another user than the checking
        # process and this one.
        drop = {"user": MODEL_UID, "group": MODEL_UID, "extra_groups": []} if os.getuid() == 0 else {}
        model = subprocess.Popen(["python3", "-I", "-S", "-c", BOOTSTRAP], stdin=stdin_read, stdout=output_write,
                                 stderr=output_write, cwd="/tmp", close_fds=True, pass_fds=(calls_read, replies_write),
                                 **drop)
    except OSError as exc:
        os.write(output_write, f"the model's process could not start: {exc}".encode())
    for fd in (stdin_read, output_write, calls_read, replies_write):
        os.close(fd)
    output, report = _Capped(output_read, output_limit), _Capped(report_read, REPORT_LIMIT)
    output.thread.start()
    report.thread.start()
    timer = threading.Timer(timeout_s, on_timeout)
    timer.start()
    try:
        harness = MODEL_HARNESS.encode()
        head = marshal.dumps((calls_read, replies_write, sys.path)).hex().encode()
        data = f"{len(harness)}\n".encode() + harness + head + b"\n" + job["solution"].encode("utf-8", "replace")
        while data and model is not None:
            data = data[os.write(stdin_write, data):]
    except OSError:
        pass  # the model's process ended (or was killed) before it read its code: the tests say so
    finally:
        os.close(stdin_write)
    _, raw = os.waitpid(checker, 0)
    seconds = time.monotonic() - started
    status = os.waitstatus_to_exitcode(raw)
    model_status = None
    if model is not None and status == LEFT:
        # Once the tests are done the model's process sees its channel close and exits at once;
        # its status says how it ended where it left the tests without answers (it may be exiting
        # still: its pipes close before it can be reaped).
        try:
            model_status = model.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    timer.cancel()
    timer.join()
    ended = end_all_others()
    kills_after = oom_kills()
    return {"status": status, "timed_out": timed_out.is_set(), "seconds": round(seconds, 3), "ended": ended,
            "model_status": model_status,
            "out_of_memory": kills_before is not None and kills_after is not None and kills_after > kills_before,
            "report": report.text(), "output": output.text()}


def main() -> None:
    import ctypes

    if os.getpid() != 1:
        sys.exit("the code executor's supervisor must be PID 1 of its container (run it without --init)")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 with no handler: a sample's signals are dropped
    global LIBC
    LIBC = ctypes.CDLL(None, use_errno=True)
    if LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("the code executor's supervisor could not make itself non-dumpable")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    config = json.loads(stdin.readline())
    while True:
        header = stdin.readline()
        if not header:
            return
        head = json.loads(header)
        job = json.loads(stdin.read(head["size"]))
        answer = run_one(int(head["secret"]), job, float(config["timeout_s"]), int(config["output_limit"]))
        answer["clean"] = answer.pop("ended") and wipe()
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()
        if not answer["clean"]:
            return


if __name__ == "__main__":  # run by the container's bootstrap; importing it runs nothing
    main()
