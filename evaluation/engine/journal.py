"""The engine's journal of a split's finished model requests: what lets a redelivered benchmark
skip the work an interrupted attempt finished (docs/benchmarks.md, "Resuming an interrupted run").

Runs in the engine, beside ``ftbus_engine.py``: it imports nothing from ftbus and nothing from
lm-eval, so that the worker's tests can run it without the toolchain.

The journal is a JSON-lines file, one line per finished request, ``{"key", "result"}``: ``key`` is
the sha256 of the request's kind (``generate_until``, ``loglikelihood``, ...) and its arguments
(the prompt, the generation settings or the continuation), ``result`` what the model answered. A
line is written as the model finishes its request: lm-eval calls its model's cache hook
(``add_partial``) for each request as each batch ends, and :class:`Journal` is that hook.

Identical requests are not one entry: lm-eval's ``repeats`` (``num_runs``) sends an item's prompt
n times, and with sampling each copy has its own answer. The journal keeps every answer of a key in
the order they were written, and a resumed run hands the k-th copy of a request the k-th answer
recorded for its key. (lm-eval's own ``--use_cache`` keys on the arguments alone, so it refuses to
cache sampled requests at all.) With greedy decoding every copy's answer is the same, so a resumed
run's outputs are an uninterrupted run's; with sampling, the restored answers are the interrupted
run's draws and the rest are new draws (the seeds restart with the job).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

JOURNAL_FILE = "journal.jsonl"


def request_key(kind: str, args: Sequence[Any]) -> str:
    """A request's identity: its kind and its arguments (as lm-eval's cache hook passes them)."""
    payload = json.dumps([kind, *args], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def read_journal(path: Path) -> dict[str, list[Any]]:
    """Every recorded answer of each key, in the order they were written. A line cut short (the
    engine killed while writing it) is not an answer: its request is generated again."""
    done: dict[str, list[Any]] = {}
    if not path.exists():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        done.setdefault(record["key"], []).append(record["result"])
    return done


def _as_answer(kind: str, result: Any) -> Any:
    # A log-likelihood answer is lm-eval's (log-likelihood, is-greedy) tuple; JSON made it a list.
    return tuple(result) if kind == "loglikelihood" and isinstance(result, list) else result


class Journal:
    """One split's journal: the answers an earlier attempt recorded (read once, at the start), and
    the file this attempt appends its own answers to (lm-eval's ``CacheHook`` interface)."""

    def __init__(self, path: Path, subset_of: Mapping[str, str] | None = None) -> None:
        self.path = Path(path)
        self.done = read_journal(self.path)
        #: How many answers of each key this run has taken from ``done`` (the k-th copy, the k-th answer).
        self.taken: dict[str, int] = {}
        #: An item is a document of a subset: a subset's tasks (the choice benchmarks' log-likelihood
        #: and letter tasks) ask about the same documents. Task name -> subset.
        self.subset_of = dict(subset_of or {})
        self.items: set[tuple[str, Any]] = set()
        self.items_generated: set[tuple[str, Any]] = set()
        self.requests = 0
        self.generated = 0
        self._fh = self.path.open("a", encoding="utf-8")

    def add_partial(self, attr: str, req: Sequence[Any] | None, res: Any) -> None:
        """lm-eval's cache hook: the model finished request ``req`` of kind ``attr`` with ``res``."""
        if req is None:  # lm-eval's rolling windows: recorded per whole request by their caller
            return
        self._fh.write(json.dumps({"key": request_key(attr, req), "result": res}, ensure_ascii=False) + "\n")
        self._fh.flush()

    def take(self, kind: str, requests: Sequence[Any]) -> tuple[list[Any], list[int]]:
        """The recorded answers of ``requests`` (lm-eval ``Instance``s: ``args``, ``task_name``,
        ``doc_id``), None where there is none, and the indices of the requests still to generate."""
        answers: list[Any] = []
        todo: list[int] = []
        for i, request in enumerate(requests):
            key = request_key(kind, request.args)
            k = self.taken.get(key, 0)
            recorded = self.done.get(key, [])
            item = (self.subset_of.get(request.task_name, request.task_name), request.doc_id)
            self.items.add(item)
            self.requests += 1
            if k < len(recorded):
                self.taken[key] = k + 1
                answers.append(_as_answer(kind, recorded[k]))
            else:
                answers.append(None)
                todo.append(i)
                self.items_generated.add(item)
        self.generated += len(todo)
        return answers, todo

    def summary(self) -> dict[str, int]:
        """What this run took from the journal: items all of whose requests were recorded, of all."""
        return {"items": len(self.items - self.items_generated), "of": len(self.items),
                "requests": self.requests, "generated": self.generated}

    def close(self) -> None:
        self._fh.close()
