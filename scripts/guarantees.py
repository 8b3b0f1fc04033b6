#!/usr/bin/env python
"""Deferral budgets and error targets with a stated confidence: how often the empirical rule and the guaranteed one
break their promise on new inputs, and what the guarantee costs (issue 30, results/guarantees.md).

On HateSpeech, ConvAbuse, ImageNet-16H (with --imagenet16h, at the noise levels asked; the data are not shipped) and
RouteLLM's MMLU data, per-input margins and 0/1 losses are computed once on a pool no model was trained on (cached
under the embedding cache's parent folder, `guarantees/`), then thresholds are calibrated on 1,000 random draws of
n inputs per size and scored on the pool. The logic lives in `research.guarantees_draws` (rules, draws),
`guarantees_data` (the pools) and `guarantees_report` (the report); this script parses the options and runs them.

Outputs (in --output-dir, default results/): guarantees.md, guarantees.json and guarantees.png.

Example:

```
HF_HUB_OFFLINE=1 python scripts/guarantees.py --imagenet16h path/to/imagenet16h
HF_HUB_OFFLINE=1 python scripts/guarantees.py --quick --output-dir /tmp/g     # a smoke run: small pools, 50 draws
HF_HUB_OFFLINE=1 python scripts/guarantees.py --render-only --overwrite      # rewrite the .md and .png from the JSON
```
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from research import guarantees_draws as g
from research import guarantees_data as data
from research.guarantees_report import findings, guarantees_markdown, plot_violations
from research.runs import confirm_overwrite, write_json

RESULTS = Path(__file__).resolve().parents[1] / "results"
DATASETS = ("hatespeech", "convabuse", "imagenet16h", "mmlu")
OUTPUTS = ["guarantees.md", "guarantees.json", "guarantees.png"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS),
                        help="imagenet16h runs only with --imagenet16h")
    parser.add_argument("--imagenet16h", default=None, help="the ImageNet-16H folder (hf_defer.data.load_imagenet16h)")
    parser.add_argument("--noise", nargs="+", type=int, default=[80, 95, 110, 125], help="ImageNet-16H noise levels")
    parser.add_argument("--sizes", nargs="+", type=int, default=list(g.SIZES), help="calibration sizes n")
    parser.add_argument("--draws", type=int, default=1000, help="random calibration draws per size")
    parser.add_argument("--budget", type=float, default=0.1, help="the deferral budget b")
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0, help="seed of the training parts, the heads and the draws")
    parser.add_argument("--mmlu-encoder", default="tfidf",
                        help="features of the MMLU questions: tfidf, or a sentence encoder (slow on a CPU)")
    parser.add_argument("--no-mapie", action="store_true", help="skip the MAPIE comparison")
    parser.add_argument("--cache-dir", default=None, help="embedding cache (default: hf_defer's)")
    parser.add_argument("--rerun", nargs="+", default=[], choices=list(g.RULES),
                        help="recompute these rules on the cached draws (the same draws) and keep the rest")
    parser.add_argument("--quick", action="store_true", help="smoke run: small pools, 2 epochs, 50 draws")
    parser.add_argument("--overwrite", action="store_true", help="replace existing result files without asking")
    parser.add_argument("--cheaper", action="store_true",
                        help="issue 47: run prediction-powered Learn-then-Test and conformal risk control on the first "
                             "--cheaper-draws draws (the same draws) and add them to the existing guarantees.json")
    parser.add_argument("--cheaper-draws", type=int, default=200, help="draws per size for --cheaper")
    parser.add_argument("--unlabeled", type=int, default=5000,
                        help="unlabelled inputs per draw for --cheaper (at most the rest of the pool)")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the .md, the .png and the findings in the JSON from the JSON")
    args = parser.parse_args(argv)
    if args.draws < 1 or min(args.sizes) < 1 or not 0 < args.budget < 1 or not 0 < args.confidence < 1:
        parser.error("--draws and --sizes must be positive, --budget and --confidence in (0, 1).")
    if args.quick:
        args.draws, args.sizes = min(args.draws, 50), [n for n in args.sizes if n <= 300]
    return args


def pool_cache(args: argparse.Namespace) -> Path:
    from hf_defer.experts.embeddings import default_embedding_cache_dir

    base = Path(args.cache_dir) if args.cache_dir else default_embedding_cache_dir()
    return base.parent / "guarantees"


def build_pools(args: argparse.Namespace) -> list[tuple[str, g.Pool]]:
    """The pools asked for (with their cache tags), loaded from the cache when built with the same settings."""
    quick = dict(max_rows=1500) if args.quick else {}
    epochs = 2 if args.quick else None
    builders = []
    if "hatespeech" in args.datasets:
        builders.append(("hatespeech", lambda: data.pool_hatespeech(
            args.seed, train_size=600 if args.quick else 6000, epochs=epochs or 50, cache_dir=args.cache_dir, **quick)))
    if "convabuse" in args.datasets:
        builders.append(("convabuse", lambda: data.pool_convabuse(args.seed, epochs=epochs or 50,
                                                                 cache_dir=args.cache_dir, **quick)))
    if "imagenet16h" in args.datasets and args.imagenet16h:
        for noise in args.noise:
            builders.append((f"imagenet16h_{noise}", lambda noise=noise: data.pool_imagenet16h(
                args.imagenet16h, noise, args.seed, epochs=epochs or 100)))
    if "mmlu" in args.datasets:
        builders.append(("mmlu", lambda: data.pool_mmlu(args.seed, train_size=500 if args.quick else 4000,
                                                        encoder=args.mmlu_encoder, cache_dir=args.cache_dir, **quick)))
    cache = pool_cache(args)
    pools = []
    for key, build in builders:
        tag = f"{key}_seed{args.seed}{'_quick' if args.quick else ''}{'_' + args.mmlu_encoder if key == 'mmlu' else ''}"
        file = cache / f"{tag}.npz"
        if file.is_file() and "predicted_if_kept" in np.load(file, allow_pickle=False):
            saved = np.load(file, allow_pickle=False)
            info = json.loads(str(saved["info"]))
            pools.append((tag, g.Pool(info["name"], saved["margins"], saved["loss_if_kept"],
                                      saved["loss_if_deferred"], info["description"], info["details"],
                                      saved["predicted_if_kept"], saved["predicted_if_deferred"])))
            print(f"{info['name']}: pool of {len(saved['margins']):,} from {file}", flush=True)
            continue
        start = time.perf_counter()
        pool = build()
        pool.details["seconds"] = round(time.perf_counter() - start, 1)
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(file, margins=pool.margins, loss_if_kept=pool.loss_if_kept, loss_if_deferred=pool.loss_if_deferred,
                 predicted_if_kept=pool.predicted_if_kept, predicted_if_deferred=pool.predicted_if_deferred, info=json.dumps({"name": pool.name, "description": pool.description, "details": pool.details}))
        print(f"{pool.name}: pool of {len(pool.margins):,} built in {pool.details['seconds']} s", flush=True)
        pools.append((tag, pool))
    return pools


def render(record: dict, output: Path) -> str:
    """The findings, the figure and the markdown from the record (the findings are kept in the JSON too)."""
    record["findings"] = findings(record)
    write_json(output / "guarantees.json", record)
    plot_violations(record, output / "guarantees.png")
    text = guarantees_markdown(record)
    (output / "guarantees.md").write_text(text)
    return text


def run_cheaper(args: argparse.Namespace, output: Path) -> int:
    """Issue 47's rules on the pools asked for, added to the record in `output/guarantees.json` (today's rows kept)
    under "cheaper", one entry per pool (replacing an earlier one of the same pool), then the report rewritten."""
    record = json.loads((output / "guarantees.json").read_text())
    sizes = tuple(n for n in args.sizes if n <= 1000)
    start = time.perf_counter()
    done = {entry["name"]: entry for entry in record.get("cheaper", [])}
    for tag, pool in build_pools(args):
        file = pool_cache(args) / (f"{tag}_cheaper_{'-'.join(map(str, sizes))}_{args.cheaper_draws}_{args.unlabeled}_"
                                   f"{args.confidence:g}.json")
        if file.is_file():
            done[pool.name] = json.loads(file.read_text()) | {"calibration": g.prediction_quality(pool)}
            print(f"{pool.name}: issue-47 draws from {file}", flush=True)
            missing = tuple(rule for rule in g.CHEAPER_RULES if any(
                rule not in results for results in done[pool.name]["sizes"].values()))
            if missing:  # rules added since: computed on the same draws, the others kept
                again = g.run_cheaper_draws(pool, sizes, args.cheaper_draws, args.confidence, args.seed,
                                            args.unlabeled, rules=missing)
                for n, results in again["sizes"].items():
                    done[pool.name]["sizes"][n].update(results)
                write_json(file, done[pool.name])
        else:
            done[pool.name] = g.run_cheaper_draws(pool, sizes, args.cheaper_draws, args.confidence, args.seed,
                                                  args.unlabeled)
            write_json(file, done[pool.name])
        if "ceiling" not in done[pool.name]:  # the best a prediction-powered test could do at the largest n
            done[pool.name]["ceiling"] = g.ppi_ceiling(pool, max(int(n) for n in done[pool.name]["sizes"]),
                                                       args.cheaper_draws, args.confidence, args.seed)
            write_json(file, done[pool.name])
        record["cheaper"] = list(done.values())
        write_json(output / "guarantees.json", record)
    before = record.get("cheaper_settings", {}).get("sizes", [])
    record["cheaper_settings"] = {"draws": args.cheaper_draws, "unlabeled": args.unlabeled,
                                  "sizes": sorted(set(before) | set(sizes)),
                                  "seconds": round(time.perf_counter() - start, 1),
                                  "date": datetime.date.today().isoformat(),
                                  "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
                                             f"{platform.python_version()}"}
    print(render(record, output))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = args.output_dir
    output.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        confirm_overwrite(output, OUTPUTS, args.overwrite)
        record = json.loads((output / "guarantees.json").read_text())
        render(record, output)
        print(f"Rewrote {output / 'guarantees.md'}, the figure and the findings from {output / 'guarantees.json'}.")
        return 0
    confirm_overwrite(output, OUTPUTS, args.overwrite)
    if args.cheaper:
        return run_cheaper(args, output)
    if "imagenet16h" in args.datasets and not args.imagenet16h:
        print("ImageNet-16H left out: its data are not shipped; pass --imagenet16h PATH.", flush=True)
    start = time.perf_counter()
    pools = build_pools(args)
    record = {"settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
              | {"date": datetime.date.today().isoformat(),
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
                 "command": "python scripts/guarantees.py " + " ".join(sys.argv[1:] if argv is None else argv)},
              "pools": []}
    for tag, pool in pools:  # the draws of a pool are cached too: a later run with more data sets reuses them
        file = pool_cache(args) / (f"{tag}_draws_{'-'.join(map(str, args.sizes))}_{args.draws}_{args.budget:g}_"
                                   f"{args.confidence:g}{'_nomapie' if args.no_mapie else ''}.json")
        if file.is_file():
            record["pools"].append(json.loads(file.read_text()))
            print(f"{pool.name}: draws from {file}", flush=True)
            if args.rerun:
                again = g.run_draws(pool, tuple(args.sizes), args.draws, args.budget, args.confidence, args.seed,
                                    mapie=not args.no_mapie, rules=tuple(args.rerun))
                for n, results in again["sizes"].items():
                    record["pools"][-1]["sizes"][n].update(results)
                write_json(file, record["pools"][-1])
        else:
            record["pools"].append(g.run_draws(pool, tuple(args.sizes), args.draws, args.budget, args.confidence,
                                               args.seed, mapie=not args.no_mapie))
            write_json(file, record["pools"][-1])
        write_json(output / "guarantees.json", record)
    record["settings"]["seconds"] = round(time.perf_counter() - start, 1)
    print(render(record, output))
    print(f"Done in {record['settings']['seconds']:.0f} s; results in {output}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
