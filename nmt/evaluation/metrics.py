"""Corpus-level BLEU, chrF and TER with sacrebleu; every score travels with its signature."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

# bleu_lc: BLEU of lowercased text after the 13a tokenization,
# what papers reporting "tokenized, lowercased BLEU" compare to
METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER, "bleu_lc": lambda: BLEU(lowercase=True)}


@dataclass
class Score:
    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def corpus_score(metric: str, hyps: list[str], refs: list[str]) -> Score:
    """One sacrebleu corpus score of hypotheses against one reference each."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    scorer = METRICS[metric]()
    result = scorer.corpus_score(hyps, [refs])
    name = "BLEU (lowercased)" if metric == "bleu_lc" else result.name
    return Score(name, float(result.score), str(scorer.get_signature()))


def corpus_scores(
    hyps: list[str], refs: list[str], metrics: tuple[str, ...] = ("bleu", "chrf", "ter", "bleu_lc")
) -> list[Score]:
    return [corpus_score(m, hyps, refs) for m in metrics]
