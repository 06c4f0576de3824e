#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh virtual environment, and run the quickstart from an empty
# folder outside the checkout: what a user who runs `pip install nmt-attention` gets. Usage: install_check.sh [PYTHON]
set -euo pipefail
PYTHON=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$ROOT/.venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WORK/dist" "$ROOT"
WHEEL=$(ls "$WORK"/dist/nmt_attention-*.whl)
"$PYTHON" -m venv "$WORK/venv"
PIP="$WORK/venv/bin/pip install -q --disable-pip-version-check"
$PIP torch==2.13.0              # the CPU wheel first (a looser torch would pull a CUDA build here)
$PIP "$WHEEL"
mkdir "$WORK/empty" && cd "$WORK/empty"
BIN="$WORK/venv/bin"
export OMP_NUM_THREADS=1
"$BIN/python" -c "import nmt, nmt.api; print('nmt', nmt.__version__, 'from', nmt.__file__)"
"$BIN/nmt-train" experiment=quickstart run_dir=run train.max_steps=20 train.valid_every=20 train.save_every=20 train.valid_bleu_sentences=20 train.progress=false
"$BIN/nmt-translate" checkpoint=run input=data/toy/test.src output=test.hyp
"$BIN/nmt-evaluate" hyp=test.hyp ref=data/toy/test.tgt
test "$(wc -l < test.hyp)" -eq "$(wc -l < data/toy/test.src)"
"$BIN/nmt-shortlist" checkpoint=run out=shortlist.tsv
"$BIN/nmt-translate" checkpoint=run input=data/toy/test.src output=test.sl.hyp decode.shortlist=shortlist.tsv
test "$(wc -l < test.sl.hyp)" -eq "$(wc -l < data/toy/test.src)"
"$BIN/python" -c "import nmt; m = nmt.load('run', device='cpu'); print(m.translate('ze bosize dibope', beam=2))"
# the decoding kernels' C source ships in the wheel and builds where there is a compiler
"$BIN/python" -c "import shutil, sys; from nmt.engine import build; lib = build.library(); print('native kernels:', build.describe()); sys.exit(lib is None and shutil.which('gcc') is not None)"
"$BIN/nmt-compare" --help > /dev/null
"$BIN/nmt-serve" --help > /dev/null
# a missing extra is one line, naming the distribution
if out=$("$BIN/nmt-serve" checkpoint=run 2>&1); then echo "nmt-serve ran without its extra?"; exit 1; fi
echo "$out" | grep -q "pip install -e '.\[serve\]' in the nmt clone" || { echo "unexpected: $out"; exit 1; }
test "$(echo "$out" | wc -l)" -eq 1
echo "install check passed: $(basename "$WHEEL") installed non-editable, quickstart ran from an empty folder"
