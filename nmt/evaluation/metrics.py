"""Corpus-level BLEU, chrF, chrF++ and TER with sacrebleu; every score travels with its signature.

COMET, a model-based metric, lives in nmt.evaluation.comet (an optional extra); its name is in METRIC_NAMES so that
every list of metrics (nmt-evaluate's `metrics`, nmt.score) is checked against one tuple.
"""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

from nmt.errors import NmtError

# chrf++: chrF with word unigrams and bigrams as well as character n-grams (Popović 2017; sacrebleu's signature says
# nw:2). bleu_lc: BLEU of lowercased text after the 13a tokenization, what papers reporting "tokenized, lowercased
# BLEU" compare to.
METRICS = {
    "bleu": BLEU,
    "chrf": CHRF,
    "chrf++": lambda: CHRF(word_order=2),
    "ter": TER,
    "bleu_lc": lambda: BLEU(lowercase=True),
}
METRIC_NAMES = (*METRICS, "comet")  # every metric a user may name
DEFAULT_METRICS = ("bleu", "chrf", "chrf++", "ter", "bleu_lc")  # what nmt-evaluate prints unless told otherwise


@dataclass
class Score:
    name: str
    score: float
    signature: str
    digits: int = 2  # shown with this many decimals (COMET, on a 0-1 scale: 4)

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.{self.digits}f}  ({self.signature})"


def check_metrics(metrics: list[str] | tuple[str, ...], key: str = "metrics") -> None:
    """Refuse an unknown or repeated metric name, naming the valid ones."""
    for name in metrics:
        if name not in METRIC_NAMES:
            raise NmtError(f"{key}: unknown metric '{name}'; expected one of {', '.join(METRIC_NAMES)}")
    if len(set(metrics)) != len(metrics):
        raise NmtError(f"{key}={list(metrics)}: a metric is named twice; expected each once")


def corpus_score(metric: str, hyps: list[str], refs: list[str]) -> Score:
    """One sacrebleu corpus score of hypotheses against one reference each."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    scorer = METRICS[metric]()
    result = scorer.corpus_score(hyps, [refs])
    name = "BLEU (lowercased)" if metric == "bleu_lc" else result.name
    return Score(name, float(result.score), str(scorer.get_signature()))


def corpus_scores(hyps: list[str], refs: list[str], metrics: tuple[str, ...] = DEFAULT_METRICS) -> list[Score]:
    """The sacrebleu scores named in `metrics`, in that order."""
    return [corpus_score(m, hyps, refs) for m in metrics]
