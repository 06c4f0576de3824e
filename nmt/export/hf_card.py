"""README.md of a `nmt-export format=hf` folder: what the model is, how to translate with it as nmt does, and exactly
when Transformers' outputs equal nmt's (nmt_export.json holds the same lines as EQUAL_OUTPUTS)."""

from __future__ import annotations

from nmt.config import DecodeConfig

EQUAL_OUTPUTS = {
    "custom_generate": (
        "model.generate(**batch, custom_generate=DIR, trust_remote_code=True) runs nmt's search "
        "(custom_generate/generate.py): nmt's greedy (num_beams=1) and beam search outputs at any num_beams, alpha, "
        "min_len and length limit (max_len_a x source tokens + max_len_b, </s> included; max_new_tokens=N is a=0, "
        "b=N) up to max_positions; the two implementations' log-probabilities agree within 1e-4 (checked at export), "
        "so only candidates closer than that could be ranked otherwise"
    ),
    "generate": (
        "Transformers' own generate: greedy (num_beams=1) with max_new_tokens=N equals nmt's greedy with "
        "max_len_a=0 max_len_b=N; num_beams=K with length_penalty=0 and early_stopping=True equals nmt's beam K at "
        "alpha=0 only (Transformers ranks by score / length ** length_penalty, nmt by GNMT's score / ((5 + length) / "
        "6) ** alpha), and only where no output reaches nmt's per-sentence length limit (max_new_tokens is one limit "
        "for the batch)"
    ),
}


def model_card(name: str, source: str, arch: str, decode: DecodeConfig, max_positions: int) -> str:
    """The folder's README.md (Markdown with the Hub's metadata header)."""
    search = f"beam {decode.beam}, alpha {decode.alpha}" if decode.beam > 1 else "greedy"
    limit = f"{decode.max_len_a} x source tokens + {decode.max_len_b}"
    return f"""---
library_name: transformers
pipeline_tag: translation
tags: [nmt, translation]
---
# {name}

A Transformer trained with nmt ({source}), exported by `nmt-export format=hf` as a {arch.capitalize()} model: it
loads with `AutoModelForSeq2SeqLM` and `AutoTokenizer` as it is, and computes nmt's log-probabilities (within 1e-4,
checked when it was written).

## Translate as nmt does

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
model = AutoModelForSeq2SeqLM.from_pretrained("{name}")
tokenizer = AutoTokenizer.from_pretrained("{name}")
batch = tokenizer(["A man rides a bike."], return_tensors="pt", padding=True)
out = model.generate(**batch, custom_generate="{name}", trust_remote_code=True)  # nmt's search
print(tokenizer.batch_decode(out, skip_special_tokens=True))
```

`custom_generate` runs `custom_generate/generate.py` in this folder (nmt's search, torch and transformers only; read
it before trusting it): by default the training run's decode settings ({search}, at most {limit} output tokens,
min_len {decode.min_len}); `num_beams=`, `alpha=`, `max_len_a=`, `max_len_b=`, `min_len=`, `max_new_tokens=` and
`num_return_sequences=` change them, `return_dict_in_generate=True` adds the normalised scores, and any other option
is refused. Loading with `from_pretrained("{name}", trust_remote_code=True)` makes it the model's `generate`.

## When the outputs equal nmt's

- With `custom_generate`: {EQUAL_OUTPUTS["custom_generate"]} (max_positions = {max_positions}).
- Without: {EQUAL_OUTPUTS["generate"]}.
"""
