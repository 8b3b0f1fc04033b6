#!/usr/bin/env python
"""Head-only training time: `DeferralTrainer` against human_ai_deferral's own `fit` and a plain loop, in one run.

human_ai_deferral (Mozannar et al., https://github.com/clinicalml/human_ai_deferral) is not a dependency of hf_defer
and none of its code is in this repository. Fetch it yourself and point `--peer-dir` at the checkout; its runs go to a
subprocess of this script with the checkout on its `PYTHONPATH` (it needs numpy, torch, scikit-learn and tqdm):

```
git clone https://github.com/clinicalml/human_ai_deferral /tmp/human_ai_deferral
HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/peer_human_ai_deferral.py --peer-dir /tmp/human_ai_deferral
```

Same protocol everywhere: the cached all-MiniLM-L6-v2 embeddings of HateSpeech (seed-0 split), a linear head
384 -> K + 1, SGD (momentum 0.9, learning rate 0.1), batch 128, `--epochs` epochs. The peer trains its S-SM
(`LceSurrogate`, alpha = 1: the Mozannar & Sontag loss) and its A-OvA (`OVASurrogate`) with `fit(...)`, no
validation during training (`test_interval = epochs`), its cosine schedule as it steps it; `DeferralTrainer` trains
the same surrogates (and A-SM) on the `datasets.Dataset` itself (the head-only fast path); the plain loop is
`plain_loop_hatespeech.plain_loop`. Runs alternate, `--repeats` times; medians and ratios are printed.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import datasets
import torch
import transformers
from torch.utils.data import DataLoader, TensorDataset

from research.table2_hatespeech import Protocol, load_splits, train_head
from plain_loop_hatespeech import _tensors, plain_loop  # benchmarks/ is the script's folder


def peer_fit(method: str, splits: datasets.DatasetDict, seed: int, protocol: Protocol) -> float:
    """Seconds of human_ai_deferral's `fit` for `method` ("ssm": LceSurrogate alpha=1, "aova": OVASurrogate). Runs in
    the subprocess of `run_peer`, whose `PYTHONPATH` holds the checkout (its `baselines` package)."""
    from baselines.lce_surrogate import LceSurrogate
    from baselines.one_v_all import OVASurrogate

    transformers.set_seed(seed)
    loaders = {}
    for name in ("train", "validation", "test"):
        features, labels, experts = _tensors(splits[name])
        loaders[name] = DataLoader(TensorDataset(features, labels, experts), batch_size=protocol.batch_size,
                                   shuffle=name == "train", generator=torch.Generator().manual_seed(seed))
    model = torch.nn.Linear(features.shape[1], 3 + 1)
    peer = (LceSurrogate if method == "ssm" else OVASurrogate)(1, 10**9, model, "cpu")
    epochs = int(protocol.epochs)
    start = time.perf_counter()
    peer.fit(loaders["train"], loaders["validation"], loaders["test"], epochs,
             optimizer=functools.partial(torch.optim.SGD, momentum=protocol.momentum), lr=protocol.learning_rate,
             scheduler=torch.optim.lr_scheduler.CosineAnnealingLR, verbose=False, test_interval=epochs)
    return time.perf_counter() - start


def run_peer(args: argparse.Namespace, method: str) -> float:
    """`peer_fit` in a subprocess of this script with `--peer-dir` first on its `PYTHONPATH`: the peer's modules never
    enter this process. Returns the seconds the subprocess prints (its fit alone, not its start or data loading)."""
    paths = [str(args.peer_dir.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
    command = [sys.executable, str(Path(__file__).resolve()), "--peer-dir", str(args.peer_dir), "--peer-only", method,
               "--epochs", str(args.epochs), "--seed", str(args.seed), *(["--data", args.data] if args.data else [])]
    result = subprocess.run(command, env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)}, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(f"human_ai_deferral's {method} run failed:\n{result.stderr}")
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-dir", type=Path, required=True, help="a checkout of clinicalml/human_ai_deferral")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None)
    parser.add_argument("--peer-only", choices=("ssm", "aova"), help=argparse.SUPPRESS)  # run_peer's subprocess
    args = parser.parse_args()
    if not (args.peer_dir / "baselines" / "lce_surrogate.py").is_file():
        raise SystemExit(f"--peer-dir must be a checkout of clinicalml/human_ai_deferral, got {args.peer_dir}.")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    splits = load_splits(args.seed, args.data)
    protocol = Protocol(epochs=args.epochs)
    if args.peer_only:
        print(peer_fit(args.peer_only, splits, args.seed, protocol))
        return
    runs = {
        "human_ai_deferral fit, S-SM": lambda: run_peer(args, "ssm"),
        "human_ai_deferral fit, A-OvA": lambda: run_peer(args, "aova"),
        **{f"DeferralTrainer, {name}": functools.partial(
            lambda name: train_head(splits, name, args.seed, protocol).train_seconds, name)
           for name in ("ssm", "aova", "asm")},
        "plain loop, A-SM": lambda: plain_loop(splits["train"], "asm", args.seed, protocol)[1],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(run())
    median = {name: statistics.median(values) for name, values in times.items()}
    plain = median["plain loop, A-SM"]
    print(f"torch {torch.__version__}, 1 thread; {args.epochs} epochs of batch {protocol.batch_size}; "
          f"{args.repeats} repeats (median)")
    print("| run | median s | all runs s | / plain loop |\n|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {median[name]:.2f} | {', '.join(f'{v:.2f}' for v in values)} | {median[name] / plain:.2f} |")


if __name__ == "__main__":
    main()
