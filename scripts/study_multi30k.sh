#!/usr/bin/env bash
# The Multi30k attention study (docs/studies/attention-multi30k/), run in parts that may end without warning.
#
#   bash scripts/study_multi30k.sh [DATA_ROOT]        # default: ../shared/data/multi30k (or $NMT_MULTI30K)
#
# It takes about 5 hours on 2 idle cores, so it runs across sessions: the finished runs' small files (config, train.log,
# results.json, eval.json, test.hyp, heatmaps.json, conditions.json: no checkpoints, no copy of the corpus) are archived
# under docs/studies/attention-multi30k/runs/ after each run, and copied back into the output folder before
# nmt-compare continues, which then skips them (a run is done when its eval.json holds today's scoring settings).
# A run that was in progress when the machine went away starts again from its last checkpoint if the output folder
# survived, else afresh. When every run is done the same command writes the report; then
#   python scripts/study_claims.py runs/attention_multi30k_cpu --out docs/studies/attention-multi30k/claims.md
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-${NMT_MULTI30K:-../shared/data/multi30k}}
OUT=${STUDY_OUT:-runs/attention_multi30k_cpu}
ARCHIVE=docs/studies/attention-multi30k/runs
BIN=${BIN:-.venv/bin}
KEEP=(config.yaml train.log results.json eval.json test.hyp heatmaps.json conditions.json)

archive() {  # every finished run in OUT -> ARCHIVE (small files only)
  for done in "$OUT"/runs/*/seed*/eval.json; do
    [ -f "$done" ] || continue
    run=$(dirname "$done"); rel=${run#"$OUT"/runs/}
    mkdir -p "$ARCHIVE/$rel"
    for f in "${KEEP[@]}"; do [ -f "$run/$f" ] && cp -p "$run/$f" "$ARCHIVE/$rel/$f"; done
  done
  return 0
}

restore() {  # archived runs the output folder lacks -> OUT
  [ -d "$ARCHIVE" ] || return 0
  for done in "$ARCHIVE"/*/seed*/eval.json; do
    [ -f "$done" ] || continue
    run=$(dirname "$done"); rel=${run#"$ARCHIVE"/}
    [ -f "$OUT/runs/$rel/eval.json" ] && continue
    mkdir -p "$OUT/runs/$rel"
    cp -p "$run"/* "$OUT/runs/$rel/"
  done
}

restore
# Archive as runs finish, while the comparison goes on.
( while sleep 60; do archive; done ) &
watcher=$!
trap 'kill $watcher 2>/dev/null || true; archive' EXIT
OMP_NUM_THREADS=1 "$BIN/nmt-compare" experiment=compare_attention_multi30k_cpu data.root="$DATA" out="$OUT"
