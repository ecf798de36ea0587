"""ftbus's OpenCompass plugin (written by evaluation/opencompass.py; do not edit here)."""

import json

from datasets import Dataset

from opencompass.datasets.base import BaseDataset
from opencompass.openicl.icl_evaluator import BaseEvaluator
from transformers import PreTrainedTokenizerBase

# OpenCompass 0.5.4's HuggingFace wrappers call tokenizer.batch_encode_plus, which transformers 5
# removed; __call__ takes the same arguments. transformers 5 is needed all the same: the toolchain
# (5.6) saves tokenizers as "TokenizersBackend", which transformers 4 cannot load.
if not hasattr(PreTrainedTokenizerBase, "batch_encode_plus"):
    def _batch_encode_plus(self, batch_text_or_text_pairs, **kwargs):
        return self(batch_text_or_text_pairs, **kwargs)

    PreTrainedTokenizerBase.batch_encode_plus = _batch_encode_plus


class FtbusJsonlDataset(BaseDataset):
    """One ftbus split file: {id, question, answer[, choices]} a line, in split order.

    Adds ``prompt`` (the question, through the model's chat template when ``chat_template_from``
    names a tokenizer: OpenCompass's perplexity models do not apply one themselves), and for
    multiple choice ``choice0..N-1`` plus ``label`` (the index of the right choice, as a string).
    """

    @staticmethod
    def load(path, chat_template_from=None, num_choices=0):
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        render = None
        if chat_template_from:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(chat_template_from)

            def render(text):
                return tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        out = []
        for row in rows:
            record = {"id": row["id"], "question": row["question"], "answer": row["answer"],
                      "prompt": render(row["question"]) if render else row["question"]}
            if num_choices:
                choices = list(row["choices"])
                if len(choices) != num_choices:
                    raise ValueError(f"item {row['id']} has {len(choices)} choices, expected {num_choices}")
                record.update({f"choice{i}": c for i, c in enumerate(choices)})
                record["label"] = str(choices.index(row["answer"]))
            out.append(record)
        return Dataset.from_list(out)


class FtbusExactMatchEvaluator(BaseEvaluator):
    """lm-eval's exact_match as ftbus configures it: case-insensitive, surrounding whitespace
    ignored. OpenCompass's EMEvaluator would also drop punctuation and articles ("-3" == "3")."""

    def score(self, predictions, references):
        details = []
        for pred, ref in zip(predictions, references):
            ok = str(pred).strip().lower() == str(ref).strip().lower()
            details.append({"pred": pred, "answer": ref, "correct": ok})
        value = 100.0 * sum(d["correct"] for d in details) / len(details) if details else 0.0
        return {"exact_match": value, "details": details}


class FtbusChoiceAccuracyEvaluator(BaseEvaluator):
    """Accuracy of PPLInferencer's choice (a label "0".."N-1"); details carry the choice texts."""

    def score(self, predictions, references, test_set):
        details = []
        for pred, ref, row in zip(predictions, references, test_set):
            ok = str(pred) == str(ref)
            details.append({"pred": row.get(f"choice{pred}", str(pred)), "answer": row["answer"],
                            "pred_label": str(pred), "gold_label": str(ref), "correct": ok})
        value = 100.0 * sum(d["correct"] for d in details) / len(details) if details else 0.0
        return {"acc": value, "details": details}
