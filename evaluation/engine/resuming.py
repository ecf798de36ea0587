"""A loaded lm-eval model seen through a split's journal (journal.py): requests the journal answers
are not sent to the model, the others are, and the model records each answer as it finishes it.

Runs in the engine (imports lm-eval; nothing from ftbus). lm-eval's ``simple_evaluate`` takes only
an ``LM``, so this is one, handing everything but the three request kinds to the model it wraps
(as lm-eval's own ``CachingLM`` does, which ``simple_evaluate`` builds itself for ``use_cache``).
"""

from __future__ import annotations

from typing import Any

from journal import Journal
from lm_eval.api.model import LM, CacheHook


class ResumingLM(LM):
    def __init__(self, lm: LM, journal: Journal) -> None:
        super().__init__()
        self.lm = lm
        self.journal = journal
        lm.set_cache_hook(journal)  # type: ignore[arg-type]  # the hook's one method, add_partial

    def release(self) -> None:
        """Detach the journal from the model (the next split has its own, or none)."""
        self.lm.set_cache_hook(CacheHook(None))
        self.journal.close()

    def _serve(self, kind: str, requests: list[Any]) -> list[Any]:
        answers, todo = self.journal.take(kind, requests)
        fresh = getattr(self.lm, kind)([requests[i] for i in todo]) if todo else []
        for i, answer in zip(todo, fresh, strict=True):
            answers[i] = answer
        return answers

    def loglikelihood(self, requests: list[Any]) -> list[Any]:
        return self._serve("loglikelihood", requests)

    def loglikelihood_rolling(self, requests: list[Any]) -> list[Any]:
        return self._serve("loglikelihood_rolling", requests)

    def generate_until(self, requests: list[Any]) -> list[Any]:
        return self._serve("generate_until", requests)

    # What lm-eval reads of its model and LM defines itself: the wrapped model's.
    @property
    def rank(self) -> int:
        return self.lm.rank

    @property
    def world_size(self) -> int:
        return self.lm.world_size

    @property
    def device(self) -> Any:
        return self.lm.device

    @property
    def tokenizer_name(self) -> str:
        return self.lm.tokenizer_name

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.lm.apply_chat_template(chat_history, add_generation_prompt)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.lm.chat_template(chat_template)

    def all_gather(self, tensor: Any) -> Any:
        return self.lm.all_gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> Any:
        return self.lm.gather_object(obj, dst)

    def barrier(self) -> None:
        self.lm.barrier()

    def __getattr__(self, name: str) -> Any:
        # Only for what this class lacks (the model's batch sizes, model info, ...).
        if name == "lm":
            raise AttributeError(name)
        return getattr(self.lm, name)
