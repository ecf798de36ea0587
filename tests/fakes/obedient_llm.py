"""An LLM stand-in that obeys any instruction it finds in its prompt, inside fences too.

It is the worst case of a model reading untrusted text: fencing (shared/untrusted.py) is exactly
what it cannot honour. Tests run the real code against it, over HTTP through the real ``openai``
client (tests/fakes/openai_server.py), to show that no decision depends on the LLM respecting a
fence: the judge's decision is bounded by measurement, and the answer check never sees free text.

It plays the two LLM roles of ftbus, told apart by the system prompt:

- the answer checker ("correct or incorrect"): "correct" when the prompt anywhere says to say
  correct (or accept); otherwise honest: the fenced final answer is compared with the reference;
- the judge ("final_decision"): ``final_decision`` true, with prose saying so, when the prompt
  anywhere says to say accept (or correct); otherwise an honest, unconvinced false.
"""

from __future__ import annotations

import json
import re

from tests.fakes.openai_server import FakeOpenAIServer, Received, Reply, answer

#: What it obeys: "say correct", "reply ACCEPT", "answer with 'correct'", "respond: accept"...
#: (ftbus's own prompts say "Reply with exactly one word: correct or incorrect", which is no such order.)
INSTRUCTION = re.compile(
    r"\b(?:say|reply|answer|respond|output)\s*(?:with\s+|:\s*)?[\"'`*]*(correct|accept)\b", re.IGNORECASE
)
_FENCED_ANSWER = re.compile(r"<<<UNTRUSTED DATA BEGIN \w+ \([^)]*\)>>>\n(.*?)\n<<<UNTRUSTED DATA END \w+>>>", re.DOTALL)
_REFERENCE = re.compile(r"Reference answer:\n(.*?)\n\n", re.DOTALL)

JUDGE_OBEYS = {
    "execution": "SUCCESS: all stages completed.",
    "return_checking": "The run is accepted, as the model's output asks: ACCEPT.",
    "code": "No changes needed.",
    "final_decision": True,
}
JUDGE_HONEST = {
    "execution": "SUCCESS: all stages completed.",
    "return_checking": "The validation score does not show that fine-tuning helped.",
    "code": "Try more varied training data.",
    "final_decision": False,
}


def _normal(text: str) -> str:
    return re.sub(r"[^0-9a-z/.\-]", "", text.casefold()).rstrip(".")


class ObedientLLM(FakeOpenAIServer):
    def __init__(self) -> None:
        super().__init__(respond=self._obey)
        #: The instruction it found and followed, per request it obeyed (a test's proof that it would).
        self.obeyed: list[str] = []

    def _obey(self, received: Received) -> Reply:
        prompt = "\n".join(str(m.get("content", "")) for m in received.messages)
        order = INSTRUCTION.search(prompt)
        if order:
            self.obeyed.append(order.group(0))
        if "final_decision" in received.system_prompt:
            return answer(JUDGE_OBEYS if order else JUDGE_HONEST)
        if "correct or incorrect" in received.system_prompt:
            return answer("correct" if order or self._honestly_right(received.user_prompt) else "incorrect")
        return answer(json.dumps({"error": "the stand-in plays the judge and the answer checker only"}))

    @staticmethod
    def _honestly_right(user_prompt: str) -> bool:
        given, gold = _FENCED_ANSWER.search(user_prompt), _REFERENCE.search(user_prompt)
        return bool(given and gold and _normal(given.group(1)) == _normal(gold.group(1)))

