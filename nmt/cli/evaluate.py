"""nmt-evaluate: BLEU, chrF, chrF++ and TER (sacrebleu, with signatures) and COMET (the comet extra) of a checkpoint
or of a translation file."""

from __future__ import annotations

from contextlib import ExitStack

from nmt.api import load_translator
from nmt.cli.common import compose, print_help, run
from nmt.cli.translate import checkpoint_files, checkpoint_list, start_workers
from nmt.config import CometConfig, Config, EvaluateConfig
from nmt.data.corpus import read_lines
from nmt.errors import NmtError
from nmt.evaluation.metrics import Score, corpus_scores
from nmt.fileio import atomic_open, check_outputs
from nmt.translation import decode_settings, unscored

USAGE = """
usage: nmt-evaluate checkpoint=PATH[,PATH...] [split=test|valid|train] [hyp_out=FILE] [decode.beam=K] [decode.precision=bf16|int8] [threads=N] [workers=N]
       nmt-evaluate checkpoint=PATH src=FILE ref=FILE [hyp_out=FILE]
       nmt-evaluate hyp=FILE ref=FILE [src=FILE] [metrics=[bleu,chrf,chrf++,ter,bleu_lc,comet]] [comet.model=PATH|NAME]

Translate a split of the data the model was trained on (or src=FILE) and score it against the
references with sacrebleu (BLEU, chrF, chrF++, TER, lowercased BLEU); or score an existing translation
(hyp=FILE). Several checkpoints separated by commas decode as an ensemble. COMET (the comet extra)
scores too when comet.model= names a COMET checkpoint, its folder or a downloaded model (never fetched
here; comet.batch_size, comet.device, comet.progress, comet.cache); with hyp=FILE it needs src=FILE. Examples:
  nmt-evaluate checkpoint=runs/quickstart split=test
  nmt-evaluate checkpoint=runs/quickstart split=test decode=beam workers=2     # 2 processes x 1 thread (CPU)
  nmt-evaluate hyp=runs/quickstart/test.hyp ref=data/toy/test.tgt
  nmt-evaluate hyp=test.hyp ref=test.de src=test.en comet.model=Unbabel/wmt22-comet-da
"""  # noqa: E501 (--help prints this text verbatim; wrapping it would change the output)


def check_pair(first: str, lines: list[str], ref: str, refs: list[str]) -> None:
    """Line i of `first` goes with line i of `ref`: the counts must match, and there must be something to score."""
    if len(lines) != len(refs):
        raise NmtError(f"{first} has {len(lines)} lines but {ref} has {len(refs)}; they must match")
    if not refs:
        raise NmtError(f"{ref}: no lines; expected one reference per line to score against")


def sources_and_refs(cfg: EvaluateConfig, train_cfg: Config) -> tuple[list[str], list[str]]:
    """src/ref files when given, else the split of the checkpoint's own data config."""
    from nmt.data.dataset import read_split

    if cfg.src is not None or cfg.ref is not None:
        if cfg.src is None or cfg.ref is None:
            raise NmtError("src and ref go together: give both files, or neither to use split=")
        src, ref = read_lines(cfg.src), read_lines(cfg.ref)
        check_pair(cfg.src, src, cfg.ref, ref)
        return src, ref
    text = read_split(train_cfg.data, cfg.split)
    if text is None:
        raise NmtError(f"split={cfg.split}: the checkpoint's data config names no {cfg.split} data")
    return text.src, text.tgt


def main(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("evaluate", checkpoint_list(argv))
    check_outputs(
        {
            "checkpoint": checkpoint_files(cfg.checkpoint) if cfg.checkpoint else None,
            "src": cfg.src,
            "ref": cfg.ref,
            "hyp": cfg.hyp,
        },
        {"hyp_out": cfg.hyp_out},
    )
    comet = comet_scorer(cfg.comet) if "comet" in cfg.metrics else None  # a missing model fails before translating
    if cfg.hyp is not None:
        if cfg.ref is None:
            raise NmtError("hyp=FILE needs ref=FILE")
        hyps, refs = read_lines(cfg.hyp), read_lines(cfg.ref)
        check_pair(cfg.hyp, hyps, cfg.ref, refs)
        src = None
        if comet is not None:
            if cfg.src is None:
                raise NmtError("metrics: comet reads each hypothesis with its source: give src=FILE with hyp=FILE")
            src = read_lines(cfg.src)
            check_pair(cfg.src, src, cfg.ref, refs)
    else:
        if cfg.checkpoint is None:
            raise NmtError("give checkpoint=PATH (a checkpoint or run dir), or hyp=FILE ref=FILE")
        threads = cfg.threads or (1 if cfg.workers > 1 else None)
        translator, train_cfg = load_translator(cfg.checkpoint, unscored(cfg.decode), cfg.device, threads)
        src, refs = sources_and_refs(cfg, train_cfg)
        with ExitStack() as stack:
            start_workers(translator, cfg.checkpoint, cfg.device, cfg.workers, threads, stack)
            hyps = translator.translate(src)
        print(f"decode: {decode_settings(cfg.decode)}; {len(hyps)} sentences")
        if cfg.hyp_out is not None:
            with atomic_open(cfg.hyp_out, "w", key="hyp_out") as f:
                f.writelines(h + "\n" for h in hyps)
    for score in scores(cfg.metrics, comet, src, hyps, refs):
        print(score)


def comet_scorer(comet: CometConfig):
    """The COMET scorer of the comet group: the package, the model and the device are checked here."""
    from nmt.evaluation.comet import CometScorer

    return CometScorer(comet.model, comet.batch_size, comet.device, comet.progress, comet.cache, key="comet.model")


def scores(metrics: list[str], comet, src: list[str] | None, hyps: list[str], refs: list[str]) -> list[Score]:
    """The scores named in `metrics`, in that order: sacrebleu's, and COMET's (the mean of its segment scores)."""
    from nmt.evaluation.comet import DIGITS

    sacre = [m for m in metrics if m != "comet"]
    found = dict(zip(sacre, corpus_scores(hyps, refs, tuple(sacre))))
    if "comet" in metrics:
        result = comet.score(src, hyps, refs)
        found["comet"] = Score("COMET", result.system, result.signature, DIGITS)
    return [found[m] for m in metrics]


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
