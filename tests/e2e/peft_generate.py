"""Run by the toolchain's Python (torch, transformers, peft): load a pulled adapter on its base model
with peft, and a pulled merged model with transformers alone, as a user would; generate greedily
for each prompt as lm-eval's generate_until does (the base model's tokenizer; with "chat", the
prompt as the one user message of its chat template, with the generation prompt; the tokenizer's
own special tokens; stop at the first stop sequence). Reads {"base", "adapter", "merged",
"prompts", "chat", "max_new_tokens", "until"} as JSON on stdin; prints {"adapter": [...],
"merged": [...]}.
"""

from __future__ import annotations

import json
import sys


def generate(model, tokenizer, prompts: list[str], chat: bool, max_new_tokens: int, until: list[str]) -> list[str]:
    import torch

    outputs = []
    for prompt in prompts:
        if chat:  # lm-eval's HFLM.apply_chat_template
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                   add_generation_prompt=True, continue_final_message=False)
        encoded = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        text = tokenizer.decode(ids[0][encoded["input_ids"].shape[1]:], skip_special_tokens=True)
        for stop in until:
            text = text.split(stop)[0]
        outputs.append(text)
    return outputs


def main() -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job = json.load(sys.stdin)
    tokenizer = AutoTokenizer.from_pretrained(job["base"])
    base = AutoModelForCausalLM.from_pretrained(job["base"], use_safetensors=True)
    adapted = PeftModel.from_pretrained(base, job["adapter"]).eval()
    merged = AutoModelForCausalLM.from_pretrained(job["merged"], use_safetensors=True).eval()
    args = (job["prompts"], job["chat"], job["max_new_tokens"], job["until"])
    print(json.dumps({"adapter": generate(adapted, tokenizer, *args),
                      "merged": generate(merged, AutoTokenizer.from_pretrained(job["merged"]), *args)}))


if __name__ == "__main__":
    main()
