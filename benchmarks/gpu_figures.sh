#!/usr/bin/env bash
# GPU figures of issue 32, item 4, in one call of 4 minutes at most (30 + 80 + 50 + 80 s) (each bench capped by `timeout`; each writes
# its JSON as soon as a measurement is done, so a bench cut short still leaves what it measured):
#   (a) fine-tuning samples/s, DeferralTrainer vs Trainer + AutoModelForSequenceClassification, bf16: MiniLM and a
#       random-weight Qwen2 with Qwen2-0.5B dimensions (full fine-tuning), peak GPU memory of each arm;
#   (b) pipeline("deferral") vs pipeline("text-classification") inputs/s on the same MiniLM weights;
#   (c) hf-defer predict rows/s, streamed from a file: MiniLM deferral model and the head-only model.
# Every JSON names the card (torch.cuda.get_device_name) and the torch/transformers versions.
#
# On the device, from the repository root:
#   MINILM=/path/to/all-MiniLM-L6-v2 OUT=$OUT bash benchmarks/gpu_figures.sh
# CPU smoke test (tiny sizes, --device cpu, same code):
#   SMOKE=1 MINILM=/path/to/minilm OUT=/tmp/gpub_out bash benchmarks/gpu_figures.sh
# Optional: PYTHON (default: python), DEVICE (default: cuda; cpu with SMOKE=1).
set -u
: "${MINILM:?set MINILM to the local MiniLM folder}"
: "${OUT:?set OUT to the folder for the JSON files}"
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
WORK=$(mktemp -d)
if [ "${SMOKE:-0}" = 1 ]; then
  DEVICE=${DEVICE:-cpu}; export OMP_NUM_THREADS=1; SCALE=5  # bf16 on a small CPU: caps 5x the GPU ones
  FT_MINILM="--batch-size 4 --max-length 16 --steps 4 --warmup 1 --repeats 1"
  FT_QWEN="--backbone qwen2-tiny-random --batch-size 4 --max-length 16 --steps 4 --warmup 1 --repeats 1"
  PIPE="--texts 32 --repeats 1 --batch-sizes 1 8"
  PRED="--text-rows 100 --features-rows 1000 --batch-size 32"
else
  DEVICE=${DEVICE:-cuda}; SCALE=1
  FT_MINILM="--batch-size 32 --max-length 128 --steps 60 --warmup 10 --repeats 2"
  FT_QWEN="--backbone qwen2-0.5b-random --batch-size 16 --max-length 128 --steps 30 --warmup 5 --repeats 2"
  PIPE="--texts 1024 --repeats 3 --batch-sizes 32 256 1"  # batch 1, the slowest, last
  PRED="--text-rows 8000 --features-rows 20000 --batch-size 256"
fi
bench() {  # name, seconds, arguments: one bench, capped, its log beside its JSON
  local name=$1 limit=$(($2 * SCALE)); shift 2
  echo "== $name (at most ${limit}s) $(date -u +%T)"
  timeout -k 5 "$limit" "$PY" "$@" --output "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  echo "== $name exit $? $(date -u +%T)"; tail -n 4 "$OUT/$name.log"
}
bench finetune_minilm 30 benchmarks/bench_finetune_overhead.py --device "$DEVICE" --backbone "$MINILM" --bf16 $FT_MINILM
bench finetune_qwen2_0_5b 80 benchmarks/bench_finetune_overhead.py --device "$DEVICE" --tokenizer "$MINILM" --bf16 $FT_QWEN
bench pipeline 50 benchmarks/bench_pipeline.py --device "$DEVICE" --backbone "$MINILM" $PIPE
bench predict_stream 80 benchmarks/bench_predict_stream.py --device "$DEVICE" --backbone "$MINILM" --workdir "$WORK" $PRED
rm -rf "$WORK"
ls -l "$OUT"
"$PY" - "$OUT" <<'SUMMARY'  # the figures in the call's output too, should the files not come back
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        data = json.loads(path.read_text())
        env = data["environment"]
        print(f"## {path.stem}: {env['device_name']}, torch {env['torch']}, transformers {env['transformers']}")
        for run in data.get("runs", []):
            print("  ", {key: (round(value, 3) if isinstance(value, float) else value) for key, value in run.items()
                         if key in ("repeat", "arm", "model", "run", "rows", "samples_per_s", "rows_per_s",
                                    "peak_gpu_memory_mib", "gpu_memory_allocated_before_mib", "train_loss")})
        for row in data.get("batch_sizes", []):
            print("  ", {key: value for key, value in row.items() if key != "seconds"})
        ratios = {key: value for key, value in data.items() if key.startswith("deferral_over")}
        if ratios:
            print("  ", ratios)
    except Exception as error:  # a file cut short by timeout is still reported
        print(f"## {path.stem}: unreadable ({error!r})")
SUMMARY
