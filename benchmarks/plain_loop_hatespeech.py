#!/usr/bin/env python
"""Speed of `DeferralTrainer` against a plain PyTorch loop on the HateSpeech linear-head protocol.

Both runs train the same model (`EncoderForDeferral(DeferralConfig(feature_size=384, num_labels=3, ...))`, same
initialisation) on the same sentence embeddings with the same optimiser (SGD, momentum 0.9, learning rate 0.1, no
weight decay), the same per-step cosine schedule, batch size and number of steps. The plain loop is what one writes
without the Hugging Face stack: `TensorDataset` + `DataLoader(shuffle=True)` + `model(...).loss.backward()`. A second,
informative run trains a bare `nn.Linear` with the surrogate loss (no `EncoderForDeferral.forward`), to show what the
model's own forward costs. The Trainer runs on the `datasets.Dataset` itself, as the reproduction does (its head-only
fast path). The runs alternate, `--repeats` times each, in one process; the median time counts.
Only training is timed (not embedding, not evaluation); each run's test metrics are printed to show they agree.

Example:

```
HF_HUB_OFFLINE=1 python benchmarks/plain_loop_hatespeech.py               # real embeddings (cached), 50 epochs
python benchmarks/plain_loop_hatespeech.py --synthetic --epochs 5         # random 384-d features, no encoder
```
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import datasets
import numpy as np
import torch
import transformers
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hf_defer import DeferralConfig, EncoderForDeferral, deferral_metrics
from hf_defer.modeling import SURROGATES, get_surrogate
from research.table2_hatespeech import Protocol, load_splits, train_head


def _tensors(split: datasets.Dataset) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    table = split.with_format("numpy", columns=["features", "labels", "expert_labels"])[:]
    return (torch.from_numpy(np.ascontiguousarray(table["features"], dtype=np.float32)),
            torch.from_numpy(table["labels"].astype(np.int64)), torch.from_numpy(table["expert_labels"].astype(np.int64)))


def plain_loop(train: datasets.Dataset, surrogate: str, seed: int, protocol: Protocol,
               bare: bool = False) -> tuple[nn.Module, float, int]:
    """Train with a plain PyTorch loop. Returns the model, the training seconds and the number of steps."""
    features, labels, experts = _tensors(train)
    transformers.set_seed(seed)
    config = DeferralConfig(feature_size=features.shape[1], num_labels=3, surrogate=surrogate)
    model = EncoderForDeferral(config)  # same initialisation as the Trainer run (same seed, same class)
    loss_fn = get_surrogate(surrogate, 3)
    loader = DataLoader(TensorDataset(features, labels, experts), batch_size=protocol.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    total_steps = math.ceil(len(loader) * protocol.epochs)
    optimizer = torch.optim.SGD(model.parameters(), lr=protocol.learning_rate, momentum=protocol.momentum,
                                weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    head = model.head  # the Linear layer(s) of the model, for the bare variant
    start = time.perf_counter()
    model.train()
    step = 0
    while step < total_steps:
        for x, y, m in loader:
            loss = loss_fn(head(x), y, m) if bare else model(features=x, labels=y, expert_labels=m).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == total_steps:
                break
    return model, time.perf_counter() - start, total_steps


def _test_metrics(model: nn.Module, test: datasets.Dataset, surrogate: str) -> dict[str, float]:
    features, labels, experts = _tensors(test)
    model.eval()
    with torch.no_grad():
        logits = model(features=features).logits
    return deferral_metrics(logits, labels, experts, surrogate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=float, default=50.0)
    parser.add_argument("--surrogate", default="asm", choices=list(SURROGATES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: tiny ops, no contention)")
    parser.add_argument("--synthetic", action="store_true", help="random features of the same shape (no encoder)")
    parser.add_argument("--data", default=None)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--output", default=None, help="also write the measurements to this JSON file")
    args = parser.parse_args()
    if args.output and Path(args.output).exists():
        raise SystemExit(f"{args.output} exists; remove it or choose another --output.")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()

    if args.synthetic:
        rng = np.random.default_rng(args.seed)

        def part(n: int) -> datasets.Dataset:
            return datasets.Dataset.from_dict(
                {"features": list(rng.normal(size=(n, 384)).astype(np.float32)), "labels": rng.integers(0, 3, n),
                 "expert_labels": rng.integers(0, 3, n)},
                features=datasets.Features({"features": datasets.List(datasets.Value("float32"), length=384),
                                            "labels": datasets.Value("int64"), "expert_labels": datasets.Value("int64")}))

        splits = datasets.DatasetDict({"train": part(17348), "test": part(4957)})
    else:
        splits = load_splits(args.seed, args.data, cache_dir=args.cache_dir)
    protocol = Protocol(epochs=args.epochs)
    trainer_run = "DeferralTrainer, datasets.Dataset (fast path, script's setting)"
    times: dict[str, list[float]] = {trainer_run: [], "plain loop": [], "plain loop, bare nn.Linear": []}
    errors: dict[str, float] = {}
    steps = math.ceil(math.ceil(len(splits["train"]) / protocol.batch_size) * protocol.epochs)
    for _ in range(args.repeats):
        result = train_head(splits, args.surrogate, args.seed, protocol)
        times[trainer_run].append(result.train_seconds)
        errors[trainer_run] = result.metrics["system_error"]
        for name, bare in (("plain loop", False), ("plain loop, bare nn.Linear", True)):
            model, seconds, plain_steps = plain_loop(splits["train"], args.surrogate, args.seed, protocol, bare)
            assert plain_steps == steps, (plain_steps, steps)
            times[name].append(seconds)
            errors[name] = _test_metrics(model, splits["test"], args.surrogate)["system_error"]
    median = {name: statistics.median(values) for name, values in times.items()}
    ratio = median[trainer_run] / median["plain loop"]
    machine = (f"{platform.platform()}; {os.cpu_count()} CPU cores ({platform.processor() or 'unknown CPU'}); "
               f"torch {torch.__version__} with {torch.get_num_threads()} thread(s); transformers {transformers.__version__}")
    print(f"{machine}\n{steps} steps of batch {protocol.batch_size}, {'synthetic' if args.synthetic else 'MiniLM'} "
          f"features, surrogate {args.surrogate}, {args.repeats} repeats (median)")
    print("| run | median s | all runs s | ms/step | test system error |\n|---|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {median[name]:.2f} | {', '.join(f'{v:.2f}' for v in values)} | "
              f"{1000 * median[name] / steps:.2f} | {errors[name]:.4f} |")
    print(f"DeferralTrainer (script's setting) / plain loop = {ratio:.2f}")
    if args.output:
        Path(args.output).write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
            "steps": steps, "batch_size": protocol.batch_size, "epochs": args.epochs, "synthetic": args.synthetic,
            "surrogate": args.surrogate, "times_s": times, "median_s": median, "ratio_trainer_over_plain": ratio,
            "test_system_error": errors}, indent=1))


if __name__ == "__main__":
    main()
