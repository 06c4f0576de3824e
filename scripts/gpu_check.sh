#!/usr/bin/env bash
# Every GPU path of the toolkit, run once on a CUDA machine, in under 10 minutes (an H100/H200-class GPU):
#
#   bash scripts/gpu_check.sh [DATA_ROOT]      # Multi30k: ../shared/data/multi30k or $NMT_MULTI30K by default
#
# One line per check (ok / FAILED / skipped, with its figure), then a summary; the exit code is the number of failed
# checks (0: all passed), or 3 when there is no CUDA GPU (nothing is run then). Work files go to $OUT
# (default runs/gpu_check, removed first). Checks:
#   cuda          torch sees the GPU(s); their names and bf16 support
#   bf16-train    the Multi30k Transformer recipe in bf16 for GPU_MINUTES (default 4) minutes of training: minutes
#                 to BLEU 40 on test2016 (greedy, every 500 updates), best BLEU, tokens/s
#   fp16-train    300 updates in fp16 with the gradient scaler: finite loss, no skipped updates past the first few
#   ddp-nccl      torchrun --nproc_per_node=$(nvidia-smi -L | wc -l) with NCCL, 200 updates (skipped with one GPU)
#   compare       nmt-compare jobs=2 on CUDA: the toy comparison, 2 variants x 1 seed, 100 updates
#   decode-int8   nmt-evaluate decode.precision=int8 on CUDA (torch._int_mm), beam 5: BLEU and sentences/s
#   decode-bf16   the same with decode.precision=bf16
#   serve         nmt-serve device=cuda: one request answered
#   ct2           nmt-export format=ctranslate2, then CTranslate2 on CUDA translates the test set (skipped without
#                 the ctranslate2 package)
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-${NMT_MULTI30K:-../shared/data/multi30k}}
OUT=${OUT:-runs/gpu_check}
BIN=${BIN:-$(dirname "$(command -v python)")}
PY=${PYTHON:-python}
MINUTES=${GPU_MINUTES:-4}

if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1 \
   || ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
  echo "gpu_check: no CUDA GPU here (nvidia-smi lists none, or torch cannot use it): nothing to check" >&2
  exit 3
fi
if [ ! -f "$DATA/train.en.gz" ] && [ ! -f "$DATA/train.en" ]; then
  echo "gpu_check: $DATA holds no Multi30k (train.en[.gz]); give its folder as the first argument" >&2
  exit 2
fi
GPUS=$(nvidia-smi -L | wc -l)
rm -rf "$OUT"; mkdir -p "$OUT"
FAILED=0; PASSED=0; SKIPPED=0
report() {  # name status detail
  printf '%-12s %-8s %s\n' "$1" "$2" "$3"
  case "$2" in ok) PASSED=$((PASSED + 1));; skipped) SKIPPED=$((SKIPPED + 1));; *) FAILED=$((FAILED + 1));; esac
}
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

# cuda
detail=$("$PY" -c "
import torch
names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(f'{len(names)} GPU(s): {\", \".join(names)}; bf16 {torch.cuda.is_bf16_supported()}; torch {torch.__version__}')
" 2>&1) && report cuda ok "$detail" || report cuda FAILED "$detail"

# bf16-train: the recipe, a few minutes, BLEU on test2016 every 500 updates
M30K=(experiment=multi30k_transformer "data.root=$DATA" train.device=cuda)
if "$BIN/nmt-train" "${M30K[@]}" train.precision=bf16 "train.max_time=$MINUTES" train.valid_every=500 \
     train.progress=false run_dir="$OUT/bf16" > "$OUT/bf16.log" 2>&1; then
  detail=$("$PY" - "$OUT/bf16" <<'EOF'
import json, re, sys
run = sys.argv[1]
results = json.load(open(f"{run}/results.json"))
log = open(f"{run}/train.log").read()
seconds_per_step = results["train_s"] / max(results["steps"], 1)
first = next((int(m.group(1)) for m in re.finditer(r"step (\d+) \| valid .*BLEU (\d+\.\d+)", log) if float(m.group(2)) >= 40), None)
to40 = f"{first * seconds_per_step / 60:.1f} min to valid BLEU 40" if first else "valid BLEU 40 not reached"
print(f"{results['steps']} updates, best valid BLEU {results['best']['score']:.2f}, {to40}, "
      f"{results['train_tokens_per_s']:.0f} tok/s")
EOF
)
  report bf16-train ok "$detail"
  "$BIN/nmt-evaluate" checkpoint="$OUT/bf16" decode=beam device=cuda > "$OUT/bf16.test" 2>&1 \
    && report bf16-test ok "$(grep -m1 '^BLEU' "$OUT/bf16.test")" || report bf16-test FAILED "see $OUT/bf16.test"
else
  report bf16-train FAILED "see $OUT/bf16.log"
fi

# fp16-train with the gradient scaler
if "$BIN/nmt-train" "${M30K[@]}" train.precision=fp16 train.max_steps=300 train.valid_every=300 \
     train.valid_bleu_sentences=50 train.progress=false run_dir="$OUT/fp16" > "$OUT/fp16.log" 2>&1; then
  report fp16-train ok "$(json "$OUT/fp16/results.json" "f\"valid loss {d['valid_loss']}, {d['skipped_updates']} skipped updates\"")"
else
  report fp16-train FAILED "see $OUT/fp16.log"
fi

# ddp-nccl
if [ "$GPUS" -gt 1 ]; then
  if "$PY" -m torch.distributed.run --standalone --nproc_per_node="$GPUS" -m nmt.cli.train "${M30K[@]}" \
       train.max_steps=200 train.valid_every=200 train.valid_bleu_sentences=50 train.progress=false \
       run_dir="$OUT/ddp" > "$OUT/ddp.log" 2>&1; then
    report ddp-nccl ok "$GPUS processes, $(json "$OUT/ddp/results.json" "f\"{d['steps']} updates, world size {d['world_size']}\"")"
  else
    report ddp-nccl FAILED "see $OUT/ddp.log"
  fi
else
  report ddp-nccl skipped "one GPU"
fi

# compare: jobs=2 on CUDA
if "$BIN/nmt-compare" experiment=compare_attention_toy variants=[luong_general,transformer] seeds=[1] jobs=2 \
     +train.max_steps=100 +train.device=cuda out="$OUT/compare" > "$OUT/compare.log" 2>&1; then
  report compare ok "report at $OUT/compare/report.md"
else
  report compare FAILED "see $OUT/compare.log"
fi

# decode-int8, decode-bf16 (on the bf16 run's model)
for p in int8 bf16; do
  if [ -f "$OUT/bf16/checkpoints/best.pt" ] && "$BIN/nmt-evaluate" checkpoint="$OUT/bf16" decode=beam \
       decode.precision=$p device=cuda > "$OUT/decode-$p.log" 2>&1; then
    report decode-$p ok "$(grep -m1 '^BLEU' "$OUT/decode-$p.log" | cut -c1-60)"
  else
    report decode-$p FAILED "see $OUT/decode-$p.log"
  fi
done

# serve on CUDA
"$BIN/nmt-serve" checkpoint="$OUT/bf16" device=cuda port=0 serve.access_log=false > "$OUT/serve.log" 2>&1 &
SERVER=$!
URL=""
for _ in $(seq 120); do
  URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.log" | head -1) && [ -n "$URL" ] && break
  sleep 1
done
if [ -n "$URL" ] && "$PY" -c "
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + '/v1/translate', data=json.dumps({'text': ['A man rides a bike.']}).encode(),
                             headers={'content-type': 'application/json'})
print(json.load(urllib.request.urlopen(req, timeout=60))['translations'][0]['text'])
" "$URL" > "$OUT/serve.out" 2>&1; then
  report serve ok "$(cat "$OUT/serve.out")"
else
  report serve FAILED "see $OUT/serve.log"
fi
kill -TERM $SERVER 2> /dev/null; wait $SERVER 2> /dev/null

# ct2 on CUDA
if "$PY" -c "import ctranslate2" 2> /dev/null; then
  if "$BIN/nmt-export" checkpoint="$OUT/bf16" format=ctranslate2 out="$OUT/ct2" > "$OUT/ct2.log" 2>&1 \
     && "$PY" - "$OUT/ct2" >> "$OUT/ct2.log" 2>&1 <<'EOF'
import sys, ctranslate2
translator = ctranslate2.Translator(sys.argv[1], device="cuda")
out = translator.translate_batch([["▁A", "▁man"]], beam_size=5)
print("ct2 cuda ok:", out[0].hypotheses[0][:5])
EOF
  then
    report ct2 ok "$(tail -1 "$OUT/ct2.log")"
  else
    report ct2 FAILED "see $OUT/ct2.log"
  fi
else
  report ct2 skipped "ctranslate2 is not installed (pip install -e '.[ct2]' in the nmt clone)"
fi

echo "gpu_check: $PASSED passed, $FAILED failed, $SKIPPED skipped (logs in $OUT)"
exit $FAILED
