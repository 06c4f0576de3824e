#!/usr/bin/env bash
# The Multi30k attention study's page, from a finished study folder (scripts/study_multi30k.sh):
#
#   bash scripts/study_publish.sh [STUDY_OUT]          # default: runs/attention_multi30k_cpu
#
# 1. the report again from the runs' files (nmt-compare report_only=true: report.md, results.csv, results.json,
#    the figures);
# 2. the attention cost curves at the study's width (scripts/bench_attention.py --dim 256, one thread: run it on
#    an otherwise idle machine, it is a timing);
# 3. the verdicts on the essay's claims (scripts/study_claims.py, with the cost curves);
# 4. all of it copied into docs/studies/attention-multi30k/ beside the archived runs.
# It refuses a study whose runs are not all finished.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${STUDY_OUT:-runs/attention_multi30k_cpu}}
DOCS=docs/studies/attention-multi30k
BIN=${BIN:-.venv/bin}
[ -f "$OUT/comparison.yaml" ] || { echo "error: $OUT/comparison.yaml not found: run scripts/study_multi30k.sh first" >&2; exit 2; }
OMP_NUM_THREADS=1 "$BIN/nmt-compare" report_only=true out="$OUT"
if grep -q "not finished" "$OUT/report.md"; then
  echo "error: $OUT: $(grep -o '[0-9]* of [0-9]* runs finished' "$OUT/report.md" | head -1): finish the study first" >&2
  exit 1
fi
mkdir -p "$DOCS"
OMP_NUM_THREADS=1 "$BIN/python" scripts/bench_attention.py --dim 256 --max-len 1024 --runs 5 --threads 1 \
  --plot "$DOCS/attention_cost.png" --json "$DOCS/attention_cost.json" | tee "$DOCS/attention_cost.txt"
"$BIN/python" scripts/study_claims.py "$OUT" --out "$DOCS/claims.md" --cost "$DOCS/attention_cost.json" > /dev/null
"$BIN/python" scripts/study_table.py "$OUT" > "$DOCS/main_table.md"
cp "$OUT"/report.md "$OUT"/results.csv "$OUT"/results.json "$DOCS/"
cp "$OUT"/*.png "$DOCS/"
echo "published: $DOCS ($(ls "$DOCS" | tr '\n' ' '))"
