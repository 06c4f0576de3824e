"""OpenNMT-py's training speed on the training benchmark's data and models, for the side-by-side in
docs/benchmarks.md: the same Multi30k pairs cut into pieces by the benchmark's own SentencePiece model, the same
joint vocabulary of 8,000, batches of 4,096 tokens, and the configs closest to `bench_transformer` and `bench_rnn`.

    python scripts/bench_opennmt.py --install                       # once: OpenNMT-py 3.5.1 in .venv-onmt
    python scripts/bench_opennmt.py data.root=data/multi30k         # both models, 60 updates each
    python scripts/bench_opennmt.py --models transformer --steps 60 data.root=data/multi30k

OpenNMT-py 3.5.1 asks for torch < 2.3; it is installed with --no-deps beside torch 2.13.0 (the wheel this project
uses; its training runs there unchanged) and the packages its training imports. It trains in fp32 (its CPU path
has no bf16) on its default threads; its own log lines give target tokens/s, and the figure reported is their
median over the updates from --from on (the first ones include its warm-up). Nothing else may run while it does:
its figure is read against ours in the same window.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-onmt"
PACKAGES = ["configargparse", "tensorboard", "pyyaml", "sacrebleu", "six", "sentencepiece", "pyonmttok<2,>=1.37",
            "rapidfuzz", "pyahocorasick", "fasttext-wheel", "spacy"]  # fmt: skip

COMMON = {
    "src_vocab": "vocab.shared",
    "tgt_vocab": "vocab.shared",
    "share_vocab": True,
    "src_vocab_size": 8000,
    "tgt_vocab_size": 8000,
    "data": {
        "corpus_1": {"path_src": "train.src", "path_tgt": "train.tgt"},
        "valid": {"path_src": "valid.src", "path_tgt": "valid.tgt"},
    },
    "batch_type": "tokens",
    "batch_size": 4096,
    "optim": "adam",
    "dropout": [0.1],
    "report_every": 10,
}
MODELS = {  # bench_transformer's shape (7.57M parameters); the closest RNN to bench_rnn's Bahdanau model
    "transformer": {
        "encoder_type": "transformer",
        "decoder_type": "transformer",
        "enc_layers": 3,
        "dec_layers": 3,
        "hidden_size": 256,
        "word_vec_size": 256,
        "transformer_ff": 1024,
        "heads": 4,
        "position_encoding": True,
        "share_embeddings": True,
        "share_decoder_embeddings": True,
        "attention_dropout": [0.1],
        "adam_beta2": 0.98,
        "learning_rate": 2,
        "decay_method": "noam",
        "warmup_steps": 100,
        "label_smoothing": 0.1,
    },
    "rnn": {
        "encoder_type": "brnn",  # 2 x 128 GRU
        "decoder_type": "rnn",
        "rnn_type": "GRU",
        "enc_layers": 1,
        "dec_layers": 1,
        "hidden_size": 256,
        "word_vec_size": 256,
        "global_attention": "mlp",  # Bahdanau's additive score
        "input_feed": 1,  # step by step, as ours
        "learning_rate": 0.001,
    },
}
REPORT = re.compile(r"Step\s+(\d+)/\s*\d+;.*?(\d+)/\s*(\d+) tok/s")


def target_rates(log: str, first: int) -> list[float]:
    """Target tokens/s of OpenNMT-py's report lines ("Step N/M; ...; SRC/TGT tok/s; ...") from update `first` on."""
    return [float(m.group(3)) for m in REPORT.finditer(log) if int(m.group(1)) >= first]


def yaml_text(config: dict) -> str:
    return json.dumps(config, indent=1)  # JSON is YAML


def install(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: any looser request pulls a CUDA build
    subprocess.run([*pip, "--no-deps", "OpenNMT-py==3.5.1"], check=True)
    subprocess.run([*pip, *PACKAGES], check=True)


def prepare(work: Path, overrides: list[str]) -> None:
    """The benchmark's training and validation pairs as SentencePiece pieces, and OpenNMT-py's vocabulary of them."""
    import sentencepiece as spm

    from nmt.cli.common import compose
    from nmt.data.dataset import prepare_data, read_split

    cfg = compose("config", ["experiment=bench_transformer", *overrides])
    prepared = prepare_data(cfg.data, log=lambda line: None)
    pieces = spm.SentencePieceProcessor(model_proto=(prepared.cache_path / "src.model").read_bytes())
    work.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("valid", "valid")):
        text = read_split(cfg.data, split)
        with open(work / f"{name}.src", "w") as src, open(work / f"{name}.tgt", "w") as tgt:
            for s, t in text:
                src.write(" ".join(pieces.encode(s, out_type=str)) + "\n")
                tgt.write(" ".join(pieces.encode(t, out_type=str)) + "\n")
    (work / "vocab.yaml").write_text(yaml_text({**COMMON, "save_data": "prepared", "overwrite": True}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--install", action="store_true", help=f"install OpenNMT-py 3.5.1 into --venv ({VENV.name})")
    parser.add_argument("--venv", type=Path, default=VENV, help="OpenNMT-py's environment")
    parser.add_argument("--models", default="transformer,rnn", help="transformer, rnn or both (comma-separated)")
    parser.add_argument("--steps", type=int, default=60, help="updates per run")
    parser.add_argument("--from", dest="first", type=int, default=30, help="the first update whose report counts")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_opennmt", help="data, configs and logs")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("overrides", nargs="*", help="nmt config overrides for the data (e.g. data.root=...)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if unknown := [m for m in models if m not in MODELS]:
        sys.exit(f"error: --models: {', '.join(unknown)} unknown; expected transformer and/or rnn")
    if not 1 <= args.first <= args.steps:
        sys.exit(f"error: --from {args.first}: expected an update between 1 and --steps ({args.steps})")
    if args.install:
        install(args.venv)
    binary = args.venv / "bin"
    if not (binary / "onmt_train").exists():
        sys.exit(f"error: --venv {args.venv}: no OpenNMT-py there; run this script with --install first")
    work = args.work.resolve()
    prepare(work, args.overrides)
    subprocess.run([str(binary / "onmt_build_vocab"), "-config", "vocab.yaml", "-n_sample", "-1"], cwd=work,
                   check=True, capture_output=True)  # fmt: skip
    results = {}
    for model in models:
        config = {**COMMON, **MODELS[model], "train_steps": args.steps, "save_model": f"{model}/model"}
        config["save_checkpoint_steps"] = args.steps * 10  # no checkpoint inside the timed updates
        (work / f"{model}.yaml").write_text(yaml_text(config))
        done = subprocess.run([str(binary / "onmt_train"), "-config", f"{model}.yaml"], cwd=work,
                              capture_output=True, text=True)  # fmt: skip
        (work / f"{model}.log").write_text(done.stdout + done.stderr)
        rates = target_rates(done.stdout + done.stderr, args.first)
        if done.returncode != 0 or not rates:
            sys.exit(f"error: OpenNMT-py's {model} run failed or reported nothing; its log: {work / f'{model}.log'}")
        results[model] = {"target_tokens_per_s": statistics.median(rates), "reports": rates}
        print(f"OpenNMT-py {model}: {statistics.median(rates):,.0f} target tokens/s (median of its reports at "
              f"updates {args.first}-{args.steps}: {', '.join(f'{r:,.0f}' for r in rates)})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
