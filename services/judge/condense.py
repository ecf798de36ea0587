"""Condense a stage log (tens of thousands of lines) into a small JSON fact sheet for the judge.

The reference filtered and truncated the log *before* parsing it (first and last 200 lines),
so a traceback in the middle of a long log was lost. Here the whole log is parsed; only the
extracted pieces are clipped. Parsing never evaluates log text: the metrics dict is read with
``ast.literal_eval``.
"""

from __future__ import annotations

import ast
import json
import re
import signal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runners.base import EXIT_OOM_KILLED, EXIT_TIMEOUT

ERROR_MAX_CHARS = 4000
TAIL_MAX_CHARS = 2000
MAX_WARNINGS = 20
WARNING_MAX_CHARS = 300
# Exception messages can run over several lines (torch elastic's ChildFailedError report);
# past this many lines the rest is log noise, not message.
MAX_MESSAGE_LINES = 25

# What the runners report for a SIGKILLed stage (128 + 9), and Python's returncode for one.
SIGKILL_EXITS = (EXIT_OOM_KILLED, -int(signal.SIGKILL))

# CSI sequences (colours, cursor moves), OSC sequences (titles, links), and lone escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:[ ]?")
_TRACEBACK_START = "Traceback (most recent call last):"
_CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# A line that starts a new log record: the end of a multi-line exception message.
_LOG_RECORD = re.compile(
    r"^(\[(INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b"
    r"|\d{4}-\d{2}-\d{2}[ T:]\d"
    r"|[IWEF]\d{4} \d{2}:\d{2}"  # glog (torch elastic, NCCL)
    r"|(INFO|WARNING|ERROR|DEBUG):"
    r"|\s*\d+%\|)"  # a tqdm bar
)
_WARNING_TAG = re.compile(r"\[WARN(?:ING)?\b[^\]]*\]\s*(.*)")
_WARNING_LINE = re.compile(
    r"^(?:WARNING[:\s]+(?:[\w.]+:)?\s*(.*)"  # WARNING:root:msg / WARNING 11-30 12:00 msg
    r"|.*?\s-\sWARNING\s-\s(.*)"  # 2025-11-30 12:00:00,000 - WARNING - msg
    r"|\d{4}-\d{2}-\d{2}[ T:][\d:.,]+\s+WARNING\s+(?:\[[^\]]*\]\s*)?(.*)"  # lm-eval: <ts> WARNING  [f:1] msg
    r"|\[?W\d{4} [\d:.]+\s+\d+\s+\S+\]\s*(.*)"  # glog (torch, NCCL): [W1130 12:00:00.000 123 file.cpp:12] msg
    r"|(?:\S+:\d+: )?(\w*Warning: .*))$"  # warnings.warn: /path/x.py:12: UserWarning: msg
)
# "module.name:123 >> " / "logging.py:328] 2025-.. >> " leaders inside tagged log lines.
_LOGGER_LEADER = re.compile(r"^.*?>>\s*")
_NUM_EXAMPLES = re.compile(r"Num examples\s*=\s*([\d,]+)")
_NUM_EPOCHS = re.compile(r"Num Epochs\s*=\s*([\d,.]+)")
_TOTAL_STEPS = re.compile(r"Total optimization steps\s*=\s*([\d,]+)")
_LOSS_LINE = re.compile(r"^\s*\{\s*'(?:loss|eval_loss)'\s*:[^{}]*\}\s*$")
_LOSS_DICT = re.compile(r"\{\s*'loss'\s*:[^{}]*\}")
_METRICS_DICT = re.compile(r"\{\s*'train_runtime'\s*:[^{}]*\}")
_BARE_TQDM = re.compile(r"^\s*\d{1,3}%\|.*\|\s*\d+/\d+")
_TQDM = re.compile(r"^\s*(?:[^|]*:\s*)?\d{1,3}%\|.*\|\s*\d+/\d+")
_METRICS_BLOCK_LINE = re.compile(r"^\s+(\w+)\s+=\s+(\S+)\s*$")
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.IGNORECASE)
_ERROR_WORD = re.compile(r"\b(error|exception|fatal|aborted|killed|segmentation fault|core dumped)\b", re.IGNORECASE)


class CondensedLog(BaseModel):
    """What the judge needs to know about one stage's log."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["success", "failed"]
    exit_code: int
    timeout: bool = False
    failed_stage: str | None = None
    oom_killed: bool = Field(default=False, description="Killed by SIGKILL, typically the kernel OOM killer.")
    cuda_oom: bool = Field(default=False, description="The GPU ran out of memory.")
    error: str | None = None
    error_count: int = 0
    training_started: bool = False
    num_examples: int | None = None
    num_epochs: float | None = None
    total_steps: int | None = None
    last_progress: str | None = Field(default=None, description="The last progress-bar state seen.")
    last_train_log: dict[str, float] | None = Field(
        default=None, description="The last per-step {'loss': ...} record the Trainer printed."
    )
    final_metrics: dict[str, float] | None = None
    completed: bool = False
    warnings: list[str] = Field(default_factory=list)
    raw_log_tail: str | None = None
    log_chars: int = Field(default=0, description="Size of the log after clean-up, before condensing.")

    def as_prompt_json(self) -> str:
        """Compact JSON for the prompt: flags that are off and absent facts are left out."""
        data: dict[str, Any] = self.model_dump(exclude_none=True)
        for flag in ("timeout", "oom_killed", "cuda_oom"):
            if not data.get(flag):
                data.pop(flag, None)
        if not data.get("warnings"):
            data.pop("warnings", None)
        if not self.training_started:
            data.pop("training_started", None)
            data.pop("completed", None)
        if self.error_count <= 1:
            data.pop("error_count", None)
        return json.dumps(data, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------- clean-up


def clean_log(log: str) -> str:
    """Remove ANSI escapes and keep only the final state of carriage-return redraws."""
    text = _ANSI.sub("", log).replace("\r\n", "\n")
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            # A terminal shows what was written after the last \r; a trailing \r (no redraw
            # after it) leaves the previous segment on screen.
            segments = [s for s in line.split("\r") if s.strip()]
            line = segments[-1] if segments else ""
        lines.append(line)
    return "\n".join(lines)


def _split_ranks(lines: list[str]) -> list[tuple[int | None, str]]:
    """Each line with its ``[rankN]:`` prefix (torchrun) removed and the rank it came from."""
    out: list[tuple[int | None, str]] = []
    for line in lines:
        m = _RANK_PREFIX.match(line)
        out.append((int(m.group(1)), line[m.end() :]) if m else (None, line))
    return out


# ---------------------------------------------------------------- tracebacks


def _is_frame_line(line: str) -> bool:
    # Frames ("  File ...", source lines, "^^^" markers, "[Previous line repeated ...]") are indented.
    return line.startswith((" ", "\t"))


def _read_traceback(lines: list[str], start: int) -> tuple[str, int, list[str]]:
    """Read one traceback, with its chained causes, from ``lines[start]``.

    Returns the text, the index after it, and the exception lines (the first is the root cause).
    """
    out: list[str] = []
    exceptions: list[str] = []
    n = len(lines)
    i = start
    while True:
        out.append(lines[i])  # "Traceback (most recent call last):"
        i += 1
        while i < n and _is_frame_line(lines[i]):
            out.append(lines[i])
            i += 1
        # The exception line, then its message's continuation lines.
        msg_lines = 0
        while i < n and lines[i].strip() and msg_lines < MAX_MESSAGE_LINES:
            line = lines[i]
            if msg_lines and (
                line.startswith(_TRACEBACK_START) or _LOG_RECORD.match(line) or line.strip() in _CHAIN_MARKERS
            ):
                break
            if msg_lines == 0:
                exceptions.append(line.strip())
            out.append(line)
            i += 1
            msg_lines += 1
        # A chained exception is the same failure: blank line, marker, blank line, Traceback.
        j = _skip_blank(lines, i)
        if j < n and lines[j].strip() in _CHAIN_MARKERS:
            k = _skip_blank(lines, j + 1)
            if k < n and lines[k].lstrip().startswith(_TRACEBACK_START):
                out.extend(["", lines[j].strip(), ""])
                lines[k] = lines[k].lstrip()
                i = k
                continue
        return "\n".join(out).rstrip(), i, exceptions


def _skip_blank(lines: list[str], i: int) -> int:
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


class _Traceback(BaseModel):
    text: str
    line_no: int
    rank: int | None
    exceptions: list[str]


def _find_tracebacks(numbered: list[tuple[int, str]], rank: int | None) -> list[_Traceback]:
    """Tracebacks in one rank's stream; ``numbered`` keeps each line's place in the whole log."""
    lines = [text for _, text in numbered]
    found: list[_Traceback] = []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith(_TRACEBACK_START):
            lines[i] = lines[i].lstrip()
            text, end, exceptions = _read_traceback(lines, i)
            found.append(_Traceback(text=text, line_no=numbered[i][0], rank=rank, exceptions=exceptions))
            i = max(end, i + 1)
        else:
            i += 1
    return found


def _clip_error(tb: _Traceback) -> str:
    text = tb.text
    if len(text) <= ERROR_MAX_CHARS:
        return text
    clipped = "...\n" + text[-ERROR_MAX_CHARS:]
    # In a chain the first exception is the root cause; keep it named even when its frames go.
    if tb.exceptions and tb.exceptions[0] not in clipped:
        clipped = f"Root cause: {tb.exceptions[0]}\n" + clipped
    return clipped


def _extract_error(ranked: list[tuple[int | None, str]]) -> tuple[str | None, int]:
    streams: dict[int | None, list[tuple[int, str]]] = {}
    for no, (rank, text) in enumerate(ranked):
        streams.setdefault(rank, []).append((no, text))
    tracebacks = [tb for rank, stream in streams.items() for tb in _find_tracebacks(stream, rank)]
    if not tracebacks:
        return None, 0
    # Every rank usually prints the same failure: count distinct errors, not copies.
    distinct = len({tb.text for tb in tracebacks})
    rank0 = [tb for tb in tracebacks if tb.rank == 0]
    # Rank 0 is the canonical process; otherwise the earliest traceback in the log is the root
    # cause (the launcher's ChildFailedError and other ranks' reactions come after it).
    root = min(rank0 or tracebacks, key=lambda tb: tb.line_no)
    error = _clip_error(root)
    if distinct > 1:
        error += f"\n[Note: {distinct} total errors, showing root cause]"
    return error, distinct


def _fallback_error(texts: list[str], warning_lines: set[int]) -> str | None:
    """For a failed run without a traceback: the last lines that read like errors."""
    picked: list[str] = []
    seen: set[str] = set()
    for no in range(len(texts) - 1, -1, -1):
        line = texts[no].strip()
        if not line or no in warning_lines or not _ERROR_WORD.search(line) or line in seen:
            continue
        seen.add(line)
        picked.append(line[: WARNING_MAX_CHARS * 2])
        if len(picked) >= 10:
            break
    if not picked:
        return None
    text = "\n".join(reversed(picked))
    return text[-ERROR_MAX_CHARS:]


# ---------------------------------------------------------------- training facts


def _to_number(value: str) -> float | None:
    value = value.replace(",", "")
    try:
        return float(value)
    except ValueError:
        pass
    # HF prints train_runtime as H:MM:SS.ss in the metrics block.
    m = re.fullmatch(r"(\d+):(\d{2}):(\d{2}(?:\.\d+)?)", value)
    if m:
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    return None


def _literal_metrics(literal: str) -> dict[str, float] | None:
    """A printed dict of numbers, read with literal_eval: log text is never executed."""
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    metrics = {str(k): n for k, v in value.items() if (n := _metric_value(v)) is not None}
    return metrics or None


def _metric_value(value: object) -> float | None:
    # transformers 5 prints the values as strings ('0.2249'); older versions as numbers.
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return _to_number(value)
    return None


def _final_metrics(text: str, texts: list[str]) -> dict[str, float] | None:
    """The Trainer's ``{'train_runtime': ...}`` dict, or failing that its "train metrics" block."""
    for literal in reversed(_METRICS_DICT.findall(text)):
        metrics = _literal_metrics(literal)
        if metrics:
            return metrics
    for no in range(len(texts) - 1, -1, -1):
        if "***** train metrics *****" in texts[no]:
            metrics = {}
            for line in texts[no + 1 : no + 30]:
                line = _LOGGER_LEADER.sub("", line) if ">>" in line else line
                m = _METRICS_BLOCK_LINE.match(line)
                if not m:
                    break
                number = _to_number(m.group(2))
                if number is not None:
                    metrics[m.group(1)] = number
            return metrics or None
    return None


def _last_train_log(text: str) -> dict[str, float] | None:
    # Scan from the end: a long run prints thousands of these, only the last one matters.
    end = len(text)
    while (start := text.rfind("{'loss'", 0, end)) != -1:
        m = _LOSS_DICT.match(text, start)
        if m and (metrics := _literal_metrics(m.group(0))):
            return metrics
        end = start
    return None


def _last_progress(texts: list[str]) -> str | None:
    """The last training progress bar; the Trainer's bar has no description, unlike
    "Writing model shards: ..." or "Running tokenizer on dataset: ..." bars."""
    fallback = None
    for line in reversed(texts):
        if _TQDM.match(line):
            if _BARE_TQDM.match(line):
                return line.strip()
            fallback = fallback or line.strip()
    return fallback


def _int(m: re.Match[str] | None) -> int | None:
    return int(m.group(1).replace(",", "")) if m else None


# ---------------------------------------------------------------- warnings


def _warning_text(line: str) -> str | None:
    m = _WARNING_TAG.search(line)
    if m:
        msg = m.group(1)
        msg = _LOGGER_LEADER.sub("", msg) if ">>" in msg else msg
        return msg.strip() or None
    m = _WARNING_LINE.match(line.strip())
    if m:
        msg = next((g for g in m.groups() if g), "")
        return msg.strip() or None
    return None


def _warnings(texts: list[str]) -> tuple[list[str], set[int]]:
    found: list[str] = []
    seen: set[str] = set()
    lines: set[int] = set()
    for no, line in enumerate(texts):
        msg = _warning_text(line)
        if msg is None:
            continue
        lines.add(no)
        msg = msg[:WARNING_MAX_CHARS]
        if msg in seen or len(found) >= MAX_WARNINGS:
            continue
        seen.add(msg)
        found.append(msg)
    return found, lines


# ---------------------------------------------------------------- entry point


def condense_log(log: str, exit_code: int, failed_stage: str | None = None) -> CondensedLog:
    """Parse the whole log of one stage into a :class:`CondensedLog`."""
    text = clean_log(log or "")
    ranked = _split_ranks(text.split("\n"))
    texts = [t for _, t in ranked]
    stripped = "\n".join(texts)

    timeout = exit_code == EXIT_TIMEOUT
    error, error_count = _extract_error(ranked)
    warnings, warning_lines = _warnings(texts)
    if error is None and exit_code != 0 and not timeout:
        error = _fallback_error(texts, warning_lines)

    training_started = "Running training" in stripped
    facts: dict[str, Any] = {}
    if training_started:
        after = stripped[stripped.index("Running training") :]
        epochs = _NUM_EPOCHS.search(after)
        facts = {
            "num_examples": _int(_NUM_EXAMPLES.search(after)),
            "num_epochs": float(epochs.group(1).replace(",", "")) if epochs else None,
            "total_steps": _int(_TOTAL_STEPS.search(after)),
            "last_progress": _last_progress(texts),
            "last_train_log": _last_train_log(after),
        }
    final_metrics = _final_metrics(stripped, texts) if training_started else None
    completed = training_started and ("Training completed" in stripped or final_metrics is not None)

    # The tail helps when nothing else explains the outcome: no error and no training facts, or a
    # failure that left no error message (a SIGKILL or a timeout mid-step).
    need_tail = error is None and (not training_started or exit_code != 0)
    tail = None
    if need_tail and text.strip():
        # Per-step loss records are summarised by last_train_log (and the loss history): leave them
        # out so the tail shows what else happened last (checkpoints, messages).
        tail_text = "\n".join(t for t in text.split("\n") if not _LOSS_LINE.match(t)) if training_started else text
        tail = tail_text[-TAIL_MAX_CHARS:]

    return CondensedLog(
        status="success" if exit_code == 0 else "failed",
        exit_code=exit_code,
        timeout=timeout,
        failed_stage=failed_stage if exit_code != 0 else None,
        oom_killed=exit_code in SIGKILL_EXITS,
        cuda_oom=bool(_CUDA_OOM.search(stripped)),
        error=error,
        error_count=error_count,
        training_started=training_started,
        final_metrics=final_metrics,
        completed=completed,
        warnings=warnings,
        raw_log_tail=tail,
        log_chars=len(text),
        **facts,
    )
