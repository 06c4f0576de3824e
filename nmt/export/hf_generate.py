"""nmt's search (nmt/search.py) for an exported model, as Transformers' `custom_generate`: `nmt-export format=hf`
writes this file, unchanged, as DIR/custom_generate/generate.py. With it, Transformers gives nmt's outputs:

    model.generate(**batch, custom_generate=DIR, trust_remote_code=True)       # the run's decode settings
    model.generate(**batch, custom_generate=DIR, trust_remote_code=True, num_beams=5, alpha=1.0)

(or load with `AutoModelForSeq2SeqLM.from_pretrained(DIR, trust_remote_code=True)`, and `model.generate` is this).

The search is nmt's beam search step for step (num_beams=1 is its greedy search):
  - each step's log-probabilities are log_softmax(logits) in float32, then <pad> and <s> made impossible, and </s>
    while fewer than min_len tokens are out;
  - the best 2K candidates over the sentence's K beams (each beam's best 2K tokens first): those of the best K that
    end in </s> finish (at the length limit, all of the best K), and the best K that do not live on;
  - a finished hypothesis' length |Y| counts its steps, </s> included (cut at the limit: its tokens alone), and
    hypotheses are ranked by score / ((5 + |Y|) / 6) ** alpha (GNMT, Wu et al. 2016, eq. 14), score the summed
    log-probability; ties go to the first finished;
  - a sentence is done when K hypotheses have finished, at its length limit, or when no live hypothesis can still
    beat its num_return_sequences-th finished one (score / lp(limit) is the best a live score can reach);
  - the length limit of sentence b is int((source tokens - 1) * max_len_a + max_len_b), at least 1, </s> included,
    the source's tokens counted by its attention mask (</s> included); max_new_tokens=N sets a=0, b=N.

Returns (B * num_return_sequences, L) token ids, each row <s>, the output, </s> where the output ended with one, then
<pad>; return_dict_in_generate=True also gives sequences_scores (the normalised scores). Other generate options
(sampling, length_penalty, logits processors, ...) are refused: they are not nmt's search.
This file needs torch and transformers only.
"""

from __future__ import annotations

import inspect

import torch

DEFAULTS = {"num_beams": 1, "alpha": 0.0, "max_len_a": 1.5, "max_len_b": 10, "min_len": 0, "num_return_sequences": 1}
# nmt's decode setting -> the generation config attribute the export writes it to (nmt_export.json has them too)
CONFIG_KEYS = {key: f"nmt_{key}" for key in ("alpha", "max_len_a", "max_len_b", "min_len")}
Found = list[list[tuple[float, list[int]]]]  # per sentence, its best hypotheses (score, steps), best first


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14)."""
    return ((5 + length) / 6) ** alpha


def max_lengths(attention_mask: torch.Tensor, a: float, b: int) -> torch.Tensor:
    """(B,) output length limits a * source length + b (source length without </s>), at least 1."""
    return ((attention_mask.sum(1) - 1).float() * a + b).long().clamp(min=1)


def settings(model, generation_config, options: dict) -> dict:
    """The search's settings: options given to generate, else the given generation config's, else the model's (the
    export's: the run's decode settings), else nmt's defaults. Options outside nmt's search are refused."""
    given = ("max_new_tokens", "return_dict_in_generate")
    unknown = sorted(k for k, v in options.items() if k not in DEFAULTS and k not in given and v not in (None, False))
    if unknown:
        raise ValueError(
            f"custom_generate (nmt's search) does not take {', '.join(unknown)}; it takes input_ids, attention_mask, "
            f"{', '.join(DEFAULTS)}, {', '.join(given)}"
        )
    configs = [c for c in (generation_config, model.generation_config) if c is not None]
    out = {}
    for key, default in DEFAULTS.items():
        stored = [getattr(c, CONFIG_KEYS.get(key, key), None) for c in configs]
        out[key] = next((v for v in [options.get(key), *stored] if v is not None), default)
    if options.get("max_new_tokens") is not None:
        if options.get("max_len_a") is not None or options.get("max_len_b") is not None:
            raise ValueError("max_new_tokens with max_len_a or max_len_b: give one length limit (N is a=0, b=N)")
        out["max_len_a"], out["max_len_b"] = 0.0, int(options["max_new_tokens"])
    if not 1 <= out["num_return_sequences"] <= out["num_beams"]:
        raise ValueError(f"num_return_sequences={out['num_return_sequences']}: expected 1 to num_beams")
    if out["max_len_a"] <= 0 and out["max_len_b"] <= 0:
        raise ValueError("max_len_a=0 and max_len_b=0: no output could be produced; expected one of them positive")
    return out


def step_log_probs(model, state: dict, prev: torch.Tensor, step: int, min_len: int) -> torch.Tensor:
    """(R, V) the next token's log-probabilities for the rows' last tokens `prev` (R,), as nmt's `log_probs`."""
    from transformers.modeling_outputs import BaseModelOutput

    rows = state["rows"]
    out = model(
        encoder_outputs=BaseModelOutput(last_hidden_state=state["enc"].index_select(0, rows)),
        attention_mask=state["mask"].index_select(0, rows),
        decoder_input_ids=prev[:, None],
        use_cache=True,
        **{state["cache_name"]: state["cache"]},
    )
    state["cache"] = getattr(out, state["cache_name"])
    logp = out.logits[:, -1].float().log_softmax(-1)
    ids = state["ids"]
    logp[:, [ids["pad"], ids["bos"]] + ([ids["eos"]] if step < min_len else [])] = float("-inf")
    return logp


class Beams:
    """The live beams of the sentences still searched (rows sentence-major, width 1 at the first step, then K) and
    the finished hypotheses of every sentence, in the order they finished."""

    def __init__(self, max_len: torch.Tensor, k: int, alpha: float, nbest: int, eos: int):
        batch, device = max_len.size(0), max_len.device
        self.k, self.alpha, self.nbest, self.eos = k, alpha, nbest, eos
        self.sent = torch.arange(batch, device=device)  # (n,) original index of each live sentence
        self.max_len = max_len  # (n,)
        self.n_done = torch.zeros(batch, dtype=torch.long, device=device)
        self.done_best = torch.full((batch, nbest), float("-inf"), device=device)  # (n, nbest) best normalised
        self.lp_limit = ((5 + max_len.float()) / 6) ** alpha  # (n,) the largest penalty a live hypothesis can reach
        self.scores = torch.zeros(batch, 1, device=device)  # (n, width) summed log-probs
        self.tokens = torch.zeros(batch, 0, dtype=torch.long, device=device)  # (n*width, t) each row's output
        self.finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]

    def advance(self, logp: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Extend every beam by step t's log-probs (n*width, V); returns the rows extended (n'*K,) and their new
        tokens (n'*K,), empty when every sentence is done."""
        (n, width), k = self.scores.shape, self.k
        row_top, row_token = logp.topk(min(2 * k, logp.size(1)), dim=1)  # (n*width, 2K)
        cand = row_top.size(1)
        top, index = (self.scores.view(-1, 1) + row_top).view(n, width * cand).topk(min(2 * k, width * cand), dim=1)
        rows = index // cand + torch.arange(n, device=logp.device)[:, None] * width  # (n, 2K) the rows extended
        token = row_token.view(n, width * cand).gather(1, index)  # (n, 2K)
        eos = token == self.eos
        final = (eos | (self.max_len == t + 1)[:, None]) & top.isfinite()
        final[:, k:] = False
        self.n_done += final.sum(1)
        for i, c in final.nonzero().tolist():
            steps = self.tokens[rows[i, c]].tolist() + [int(token[i, c])]
            self.finished[int(self.sent[i])].append((float(top[i, c]), steps))
        pick = eos.to(torch.uint8).argsort(dim=1, stable=True)[:, :k]  # the first K candidates without </s>
        rows, token, scores = (x.gather(1, pick) for x in (rows, token, top))
        if bool(final.any()):
            norm = torch.where(final, top / ((5 + t + 1) / 6) ** self.alpha, float("-inf"))
            self.done_best = torch.cat([self.done_best, norm], 1).topk(self.nbest, dim=1).values
        live = (self.n_done < k) & (self.max_len > t + 1)
        live &= scores[:, 0] / self.lp_limit > self.done_best[:, -1]
        rows, token, self.scores = rows[live].reshape(-1), token[live].reshape(-1), scores[live]
        self.sent, self.max_len, self.n_done = self.sent[live], self.max_len[live], self.n_done[live]
        self.done_best, self.lp_limit = self.done_best[live], self.lp_limit[live]
        self.tokens = torch.cat([self.tokens.index_select(0, rows), token[:, None]], 1)
        return rows, token

    def best(self, nbest: int) -> Found:
        """Each sentence's nbest finished (normalised score, steps), best first (ties: the first finished first)."""
        ranked = []
        for hyps in self.finished:
            norms = [(score / length_penalty(len(steps), self.alpha), steps) for score, steps in hyps]
            ranked.append(sorted(norms, key=lambda h: -h[0])[:nbest])
        return ranked


@torch.no_grad()
def search(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, s: dict) -> Found:
    """nmt's beam search of width s["num_beams"] over the batch; per sentence its best hypotheses (score, steps)."""
    config = model.generation_config
    ids = {"pad": config.pad_token_id, "bos": config.decoder_start_token_id, "eos": config.eos_token_id}
    max_len = max_lengths(attention_mask, s["max_len_a"], s["max_len_b"])
    max_len = max_len.clamp(max=model.config.max_position_embeddings)  # the position table: no output is longer
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    state = {
        "enc": model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,  # (B, S, H)
        "mask": attention_mask,
        "rows": torch.arange(input_ids.size(0), device=input_ids.device),  # each row's sentence
        "cache": None,
        "cache_name": cache_name,
        "ids": ids,
    }
    beams = Beams(max_len, s["num_beams"], float(s["alpha"]), s["num_return_sequences"], ids["eos"])
    prev = torch.full((input_ids.size(0),), ids["bos"], dtype=torch.long, device=input_ids.device)
    for t in range(int(max_len.max())):
        logp = step_log_probs(model, state, prev, t, s["min_len"])
        rows, prev = beams.advance(logp, t)
        if rows.numel() == 0:
            break
        state["cache"].reorder_cache(rows)
        state["rows"] = state["rows"].index_select(0, rows)
    return beams.best(s["num_return_sequences"])


def generate(inputs=None, generation_config=None, *, model, input_ids=None, attention_mask=None, **options):
    """Transformers' `generate`, run as nmt's search (see the module docstring)."""
    input_ids = inputs if inputs is not None else input_ids
    if input_ids is None:
        raise ValueError("custom_generate (nmt's search): no input_ids; give the tokenizer's output, generate(**batch)")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    s = settings(model, generation_config, options)
    found = search(model, input_ids, attention_mask.long(), s)
    config = model.generation_config
    nret = s["num_return_sequences"]
    found = [hyps + [(float("-inf"), [])] * (nret - len(hyps)) for hyps in found]  # (none short: the limit ends K)
    rows = [[config.decoder_start_token_id] + steps for hyps in found for _, steps in hyps]
    width = max(len(r) for r in rows)
    sequences = torch.full((len(rows), width), config.pad_token_id, dtype=torch.long, device=input_ids.device)
    for i, row in enumerate(rows):
        sequences[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    if not options.get("return_dict_in_generate"):
        return sequences
    from transformers.generation.utils import GenerateBeamEncoderDecoderOutput

    scores = torch.tensor([norm for hyps in found for norm, _ in hyps], device=input_ids.device)
    return GenerateBeamEncoderDecoderOutput(sequences=sequences, sequences_scores=scores)
