#!/usr/bin/env python
"""Certified thresholds on 100,000 cached margins: the time calibration takes beyond computing the margins (issue 30).

Synthetic cached arrays (margins ~ U(-1, 1), two experts, 0/1 losses, prices 1 and 0.2), and each kind of promise
timed as `calibrate_deferral` runs it after the pipeline pass: today's empirical budget, a budget with confidence 0.9,
per-expert budgets, a mean-cost budget (Hoeffding-Bentkus), the system and selective errors (Learn-then-Test), and all
of a budget, an error target and a cost budget together. Median of the rounds, after one warm-up call (scipy and MAPIE
imports). With `--model`, also a head-only `calibrate_deferral` on `--model-n` feature vectors, end to end, and the pipeline
pass alone, so that the difference is the time beyond the margins.

Example:

```
python benchmarks/bench_guarantees.py                 # 100,000 inputs, 5 rounds
python benchmarks/bench_guarantees.py --n 1000000 --rounds 3 --model --model-n 10000
```
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from hf_defer.evaluation.guarantees import budget_threshold, certify_threshold


def _median_seconds(call: Callable[[], object], rounds: int) -> float:
    call()  # warm-up: imports
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", action="store_true", help="also time calibrate_deferral end to end")
    parser.add_argument("--model-n", type=int, default=10_000, help="inputs of the end-to-end run (default 10,000)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.n
    margins = rng.uniform(-1, 1, size=n)
    experts = np.where(rng.uniform(size=n) < 0.3, "alice", "bob")
    kept = (rng.uniform(size=n) < 0.1 + 0.1 * (margins + 1)).astype(float)
    deferred = (rng.uniform(size=n) < 0.05).astype(float)
    costs = np.where(experts == "alice", 1.0, 0.2)
    error = {"max_error": 0.15, "loss_if_kept": kept, "loss_if_deferred": deferred}
    cost = {"max_mean_cost": 0.1, "cost_if_deferred": costs, "cost_bound": 1.0}
    kinds = {
        "budget, empirical rule (today)": lambda: budget_threshold(margins, 0.1),
        "budget, confidence 0.9": lambda: budget_threshold(margins, 0.1, confidence=0.9),
        "budget per expert (2)": lambda: certify_threshold(margins, confidence=0.9, experts=experts,
                                                           max_deferral_rate={"alice": 0.05, "bob": 0.1}),
        "mean cost (Hoeffding-Bentkus)": lambda: certify_threshold(margins, confidence=0.9, **cost),
        "system error (exact binomial)": lambda: certify_threshold(margins, confidence=0.9, **error),
        "selective error": lambda: certify_threshold(margins, confidence=0.9, selective=True, max_error=0.2,
                                                     loss_if_kept=kept),
        "budget + error + cost": lambda: certify_threshold(margins, confidence=0.9, max_deferral_rate=0.4,
                                                           **{**error, "max_error": 0.16}, **cost),
    }
    print(f"n = {n:,}; python {platform.python_version()}, {platform.machine()}; median of {args.rounds}")
    print("| promise | median s |\n|---|---|")
    for name, call in kinds.items():
        print(f"| {name} | {_median_seconds(call, args.rounds):.3f} |")
    if args.model:
        _end_to_end(args.model_n, args.rounds)


def _end_to_end(n: int, rounds: int) -> None:
    os.environ["TQDM_DISABLE"] = "1"  # no progress bar in the timings
    import torch
    from datasets import Dataset
    from transformers import pipeline

    import hf_defer

    torch.set_num_threads(1)
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=16, num_labels=3)).eval()
    features = np.random.default_rng(1).normal(size=(n, 16)).astype("float32")
    data = Dataset.from_dict({"features": features})
    pipe = pipeline("deferral", model=model)

    def margins_only() -> None:
        rows = (row for row in data.with_format("numpy").iter(batch_size=256) for row in row["features"])
        for _ in pipe(rows, batch_size=256, return_margin=True):
            pass

    def calibrate() -> None:
        hf_defer.calibrate_deferral(model, data, max_deferral_rate=0.1, confidence=0.9, batch_size=256)

    alone = _median_seconds(margins_only, rounds)
    full = _median_seconds(calibrate, rounds)
    print(f"\nhead-only model, {n:,} feature vectors, batch 256: pipeline pass {alone:.2f} s, calibrate_deferral "
          f"{full:.2f} s, beyond the margins {full - alone:.2f} s")


if __name__ == "__main__":
    main()
