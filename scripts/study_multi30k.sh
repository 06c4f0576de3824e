#!/usr/bin/env bash
# The Multi30k attention study (docs/studies/attention-multi30k/): en->de, its crossover runs, then en->fr, run in
# parts that may end without warning.
#
#   bash scripts/study_multi30k.sh [DATA_ROOT]        # default: ../shared/data/multi30k (or $NMT_MULTI30K)
#
# Every run trains the same updates on the same batches (budget=updates), so its numbers do not depend on the host or
# on what else runs: the study may run beside other work, stopped and continued as often as needed. It takes about a
# day on 2 cores. The finished runs' small files (config, train.log, results.json, eval.json, the test translations at
# each budget point, heatmaps.json, conditions.json: no checkpoints, no copy of the corpus) are archived under
# docs/studies/attention-multi30k/{en-de,en-fr}/runs/ as they finish, and copied back into the output folders before
# nmt-compare continues, which then skips them (an extended run whose checkpoints are gone trains again from the
# start, which gives the same run). The speed probes are not part of this script: they need an idle machine
#   nmt-compare experiment=compare_attention_multi30k_cpu data.root=DATA out=runs/attention_multi30k_cpu_probes probe=true
# and scripts/study_publish.sh writes the pages once the runs are done.
#
# Environment: STUDY_CODE, a checkout whose nmt package runs the study (default: this one), so that the code can be
# frozen at one commit in a git worktree while this checkout changes; BIN, the virtual environment's bin folder;
# STUDY_RUNS, where the output folders go (default runs/); STUDY_PAIRS, which pairs to run ("en-de en-fr").
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$(pwd)
DATA=${1:-${NMT_MULTI30K:-../shared/data/multi30k}}
DATA=$(cd "$DATA" && pwd)
CODE=${STUDY_CODE:-$HERE}
BIN=${BIN:-$HERE/.venv/bin}
RUNS=${STUDY_RUNS:-$HERE/runs}
DOCS=${STUDY_DOCS:-$HERE/docs/studies/attention-multi30k}
PAIRS=${STUDY_PAIRS:-en-de en-fr}
KEEP=(config.yaml train.log results.json eval.json test.hyp heatmaps.json conditions.json)

archive() {  # every scored run in $1 -> $2 (small files only)
  local out=$1 dest=$2 done run rel f
  for done in "$out"/runs/*/seed*/eval.json; do
    [ -f "$done" ] || continue
    run=$(dirname "$done"); rel=${run#"$out"/runs/}
    mkdir -p "$dest/$rel"
    for f in "${KEEP[@]}"; do [ -f "$run/$f" ] && cp -p "$run/$f" "$dest/$rel/$f"; done
    for f in "$run"/test.at*.hyp; do [ -f "$f" ] && cp -p "$f" "$dest/$rel/"; done
  done
  return 0
}

restore() {  # archived runs the output folder lacks -> $1
  local out=$1 src=$2 done run rel
  [ -d "$src" ] || return 0
  for done in "$src"/*/seed*/eval.json; do
    [ -f "$done" ] || continue
    run=$(dirname "$done"); rel=${run#"$src"/}
    [ -f "$out/runs/$rel/eval.json" ] && continue
    mkdir -p "$out/runs/$rel"
    cp -p "$run"/* "$out/runs/$rel/"
  done
}

study() {  # experiment, output folder, archive folder
  local experiment=$1 out=$2 dest=$3 watcher
  restore "$out" "$dest"
  ( while sleep 60; do archive "$out" "$dest"; done ) &
  watcher=$!
  trap 'kill $watcher 2>/dev/null || true; archive "$out" "$dest"' EXIT
  (cd "$CODE" && OMP_NUM_THREADS=1 PYTHONPATH="$CODE" "$BIN/python" -m nmt.cli.compare \
    experiment="$experiment" data.root="$DATA" out="$out" progress=false data.cache_dir="$RUNS/cache")
  kill $watcher 2>/dev/null || true
  archive "$out" "$dest"
  trap - EXIT
}

for pair in $PAIRS; do
  case $pair in
    en-de) study compare_attention_multi30k_cpu "$RUNS/attention_multi30k_cpu" "$DOCS/en-de/runs" ;;
    en-fr) study compare_attention_multi30k_en_fr "$RUNS/attention_multi30k_en_fr" "$DOCS/en-fr/runs" ;;
    *) echo "error: STUDY_PAIRS: unknown pair '$pair'; expected en-de or en-fr" >&2; exit 2 ;;
  esac
done
