"""nmt-average run=RUN_DIR [last=N] [output=FILE]: average the weights of a run's newest N checkpoints."""

from __future__ import annotations

from pathlib import Path

from nmt.cli.common import compose, print_help, run
from nmt.errors import NmtError
from nmt.fileio import check_outputs

USAGE = """
usage: nmt-average run=RUN_DIR [last=N] [output=FILE]

Average the weights of the newest N step checkpoints of a run (checkpoints/step_*.pt; a run keeps
train.keep_last of them, plus the best ones) into one checkpoint, by default RUN_DIR/checkpoints/average.pt.
The result translates like any checkpoint. Example:
  nmt-average run=runs/quickstart last=3
  nmt-translate checkpoint=runs/quickstart/checkpoints/average.pt input=test.src output=test.hyp
"""


def main(argv: list[str]) -> None:
    from nmt.training.checkpoint import (
        FORMAT,
        average_weights,
        checkpoint_config,
        load_checkpoint,
        step_checkpoints,
        write_payload,
    )

    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    cfg = compose("average", argv)
    folder = Path(cfg.run) / "checkpoints"
    if not folder.is_dir():
        raise NmtError(f"run={cfg.run}: no checkpoints/ folder there; expected a run dir written by nmt-train")
    found = step_checkpoints(folder)
    if len(found) < cfg.last:
        raise NmtError(
            f"last={cfg.last}: {cfg.run} has only {len(found)} step checkpoints "
            "(train.keep_last sets how many a run keeps)"
        )
    paths = list(found.values())[-cfg.last :]
    output = Path(cfg.output) if cfg.output is not None else folder / "average.pt"
    check_outputs({"run": ",".join(map(str, paths))}, {"output": output})
    payloads = [load_checkpoint(p) for p in paths]
    newest_model = checkpoint_config(payloads[-1]).model
    for payload in payloads[:-1]:
        what = (
            "model config"
            if checkpoint_config(payload).model != newest_model
            else "tokenizer"
            if payload["tokenizer"] != payloads[-1]["tokenizer"]
            else None
        )
        if what:
            raise NmtError(
                f"{payload['path']}: its {what} differs from {payloads[-1]['path']}'s; "
                "only checkpoints of one model can be averaged"
            )
    newest = payloads[-1]
    averaged = {
        "format": FORMAT,
        "version": min(p.get("version", 1) for p in payloads),  # the weights' meaning is the inputs'
        "model": average_weights(payloads),
        "config": newest["config"],
        "tokenizer": newest["tokenizer"],
        "step": newest["step"],
        "train_state": None,
        "averaged": [f"{Path(p).name}" for p in paths],
    }
    write_payload(output, averaged, key="output")
    print(f"averaged {', '.join(averaged['averaged'])} into {output}")


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
