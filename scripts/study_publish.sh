#!/usr/bin/env bash
# The Multi30k attention study's pages, from its output folders (scripts/study_multi30k.sh):
#
#   bash scripts/study_publish.sh [--partial] [--curves]
#
# For each pair (en-de, en-fr) whose output folder exists: the report again from the runs' files (nmt-compare
# report_only=true: report.md with the ranking at each budget point, the crossover, the speed probes' time-matched view,
# the claims' verdicts; results.csv, results.json, the figures), copied into docs/studies/attention-multi30k/PAIR/.
# --curves first measures the attention cost curves (scripts/bench_attention.py at the study's width, to 4,096 source
# tokens, one thread: a timing, so only on an otherwise idle machine) into the docs folder and each output folder,
# where the cost claims read them. The speed probes are read from OUT_probes/probes.json where that exists (they
# run in a folder of their own, since the grid's nmt-compare holds OUT). Without --partial it refuses a study whose
# runs are not all finished.
# Environment: STUDY_RUNS (default runs/), BIN (the virtual environment's bin folder).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${STUDY_RUNS:-runs}
DOCS=docs/studies/attention-multi30k
BIN=${BIN:-.venv/bin}
PARTIAL=0 CURVES=0
for arg in "$@"; do
  case $arg in
    --partial) PARTIAL=1 ;;
    --curves) CURVES=1 ;;
    *) echo "error: $arg: unknown option; expected --partial or --curves" >&2; exit 2 ;;
  esac
done
if [ "$CURVES" = 1 ]; then
  mkdir -p "$DOCS"
  OMP_NUM_THREADS=1 "$BIN/python" scripts/bench_attention.py --dim 256 --max-len 4096 --runs 5 --threads 1 \
    --plot "$DOCS/attention_cost.png" --json "$DOCS/attention_cost.json" | tee "$DOCS/attention_cost.txt"
fi
for pair in en-de en-fr; do
  case $pair in
    en-de) out=$RUNS/attention_multi30k_cpu ;;
    en-fr) out=$RUNS/attention_multi30k_en_fr ;;
  esac
  [ -f "$out/comparison.yaml" ] || { echo "$pair: $out/comparison.yaml not found, skipped"; continue; }
  [ -f "$DOCS/attention_cost.json" ] && cp "$DOCS/attention_cost.json" "$out/attention_cost.json"
  # the speed probes run in a folder of their own (the grid's nmt-compare holds the output folder while it runs);
  # they are archived beside the runs (DOCS/PAIR/probes.json), which a fresh checkout reads
  if [ -f "${out}_probes/probes.json" ]; then
    mkdir -p "$DOCS/$pair" && cp "${out}_probes/probes.json" "$DOCS/$pair/probes.json"
  fi
  [ -f "$DOCS/$pair/probes.json" ] && cp "$DOCS/$pair/probes.json" "$out/probes.json"
  OMP_NUM_THREADS=1 "$BIN/nmt-compare" report_only=true out="$out" > /dev/null
  finished=$(grep -o '[0-9]* of [0-9]* runs finished' "$out/report.md" | head -1)
  if [ "$PARTIAL" = 0 ] && grep -q "not finished" "$out/report.md"; then
    echo "error: $out: $finished: finish the study first (or give --partial)" >&2
    exit 1
  fi
  mkdir -p "$DOCS/$pair"
  cp "$out"/report.md "$out"/results.csv "$out"/results.json "$DOCS/$pair/"
  cp "$out"/*.png "$DOCS/$pair/" 2>/dev/null || true
  echo "published $pair ($finished): $DOCS/$pair"
done
