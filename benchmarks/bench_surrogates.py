#!/usr/bin/env python
"""Forward + backward of each deferral surrogate against `F.cross_entropy` on logits of the same width.

For every size (K classes, one expert: logits `[B, K + 1]`, float32) and every round, the runs alternate: cross-entropy,
then each surrogate as a training loop calls it (`surrogate(logits, labels, expert_labels, check=False)`: the data
was checked once beforehand) and as a direct call checks it (`check=True`: finite logits, labels in range, one pass
each). Each timed sample repeats the call enough times to last a few milliseconds; the ratio to cross-entropy is
taken within each round and the median over the rounds is printed, so that load from other processes cancels out.
The times of the code before the kernels were rewritten are recorded in benchmarks/README.md ("before" column).

At B = 4,096 the ratios depend on the allocator: by default glibc returns large freed blocks to the system, and a new
`[B, K + 1]` tensor's first touch costs page faults (system time, which `--clock cpu` counts), so cross-entropy's
three allocations per step weigh on the anchor; with `MALLOC_MMAP_THRESHOLD_=4000000000
MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_TOP_PAD_=268435456` in the environment the memory stays with the process and
the ratios are those of the passes alone. benchmarks/README.md records both.

Example:

```
python benchmarks/bench_surrogates.py                       # all sizes, 15 rounds, 1 torch thread
python benchmarks/bench_surrogates.py --rounds 5 --classes 3 100
```
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hf_defer.modeling.surrogates import SURROGATES, get_surrogate


CLOCK = time.perf_counter


def _timed(step: Callable[[], None], repeats: int) -> float:
    start = CLOCK()
    for _ in range(repeats):
        step()
    return (CLOCK() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[3, 100, 1000])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sample-ms", type=float, default=20.0, help="target length of one timed sample")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: elapsed time; cpu: this process's CPU time (time.process_time), which leaves out "
                             "the time the process waited for a core on a shared machine")
    parser.add_argument("--surrogates", nargs="+", default=list(SURROGATES), choices=list(SURROGATES))
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)

    print(f"{platform.platform()}; {platform.processor() or 'CPU'}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); "
          f"{args.clock} clock, {args.rounds} rounds, median of per-round ratios to F.cross_entropy (forward + backward, float32, M = 1)")
    columns = ["check=False", "check=True"]
    print("| surrogate | K | B | cross-entropy µs | " + " | ".join(f"{c} ×CE" for c in columns) + " |")
    print("|---|---|---|---|" + "---|" * len(columns))
    generator = torch.Generator().manual_seed(0)
    for K in args.classes:
        for B in args.batch_sizes:
            logits = torch.randn(B, K + 1, generator=generator, requires_grad=True)
            labels = torch.randint(0, K, (B,), generator=generator)
            experts = torch.where(torch.rand(B, generator=generator) < 0.7, labels,
                                  torch.randint(0, K, (B,), generator=generator))
            steps: dict[str, Callable[[], None]] = {"ce": lambda: F.cross_entropy(logits, labels).backward()}
            for name in args.surrogates:
                loss = get_surrogate(name, K)
                steps[f"{name} check=False"] = lambda loss=loss: loss(logits, labels, experts, check=False).backward()
                steps[f"{name} check=True"] = lambda loss=loss: loss(logits, labels, experts).backward()
            repeats = {key: max(1, int(args.sample_ms / 1000 / _timed(step, 3))) for key, step in steps.items()}
            times: dict[str, list[float]] = {key: [] for key in steps}
            for _ in range(args.rounds):
                for key, step in steps.items():
                    logits.grad = None
                    times[key].append(_timed(step, repeats[key]))
            ce = statistics.median(times["ce"]) * 1e6
            for name in args.surrogates:
                ratios = [statistics.median([t / c for t, c in zip(times[f"{name} {col}"], times["ce"])])
                          for col in columns]
                print(f"| {name} | {K} | {B} | {ce:.0f} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
