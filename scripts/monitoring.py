#!/usr/bin/env python
"""Monitoring a deferral model's promises on streams that shift at a known row (issue 45, results/monitoring.md).

Streams of `--pre` in-distribution inputs then `--post` shifted ones: ImageNet-16H from noise 80 to 95 and to 125
(with --imagenet16h; the data are not shipped) and without a shift, HateSpeech without a shift, MMLU routing from the
humanities and social sciences to STEM and medicine, and without a shift. On each: hf_defer's `DeferralMonitor`
(anytime-valid, a random audit of `--audit-rate` of the kept inputs labelled), the naive test on fixed windows,
repeated (at the monitor's per-test level, and Bonferroni-adjusted over the stream's windows), and the label-free
estimate of the system error per window against the truth, beside NannyML's CBPE (run in its own virtualenv,
`--nannyml-python`; without it, a faithful re-implementation, named as such in the report).

Outputs (in --output-dir, default results/): monitoring.md, monitoring.json and monitoring.png.

Example:

```
HF_HUB_OFFLINE=1 python scripts/monitoring.py --imagenet16h path/to/imagenet16h --nannyml-python nannyml-venv/bin/python
HF_HUB_OFFLINE=1 python scripts/monitoring.py --streams 20 --output-dir /tmp/m      # a smoke run
HF_HUB_OFFLINE=1 python scripts/monitoring.py --render-only                         # the .md and .png from the JSON
```
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from research import monitoring_data as data  # noqa: E402
from research import monitoring_streams as streams  # noqa: E402
from research.monitoring_report import (  # noqa: E402
    cbpe_reimplemented, followup_markdown, monitoring_markdown, plot_monitoring)

RESULTS = Path(__file__).resolve().parents[1] / "results"
OUTPUTS = ["monitoring.md", "monitoring.json", "monitoring.png"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--imagenet16h", default=None, help="the ImageNet-16H folder (hf_defer.data.load_imagenet16h)")
    parser.add_argument("--streams", type=int, default=500, help="streams per scenario")
    parser.add_argument("--pre", type=int, default=2000, help="in-distribution inputs before the shift")
    parser.add_argument("--post", type=int, default=2000, help="shifted inputs after it")
    parser.add_argument("--window", type=int, default=250, help="rows per window (naive test, CBPE chunks)")
    parser.add_argument("--batch", type=int, default=50, help="decisions per monitor update")
    parser.add_argument("--budget", type=float, default=0.2, help="the deferral budget")
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--audit-rate", type=float, default=0.1, help="share of kept inputs labelled by an audit")
    parser.add_argument("--cbpe-streams", type=int, default=100, help="streams per scenario also given to CBPE")
    parser.add_argument("--nannyml-python", default=None,
                        help="python of a virtualenv with nannyml==0.13.1 (default: CBPE re-implemented)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where the fitted populations are cached (default: $HF_HOME/hf_defer/monitoring)")
    parser.add_argument("--overwrite", action="store_true", help="replace committed results")
    parser.add_argument("--render-only", action="store_true", help="rewrite the .md and .png from the JSON")
    return parser.parse_args(argv)


def cached(cache: Path, key: str, build) -> data.Setting:
    path = cache / f"{key}.pkl"
    if path.exists():
        with open(path, "rb") as handle:
            return pickle.load(handle)
    value = build()
    cache.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        pickle.dump(value, handle)
    return value


def scenarios(args: argparse.Namespace, cache: Path) -> list[tuple[str, data.Setting, str, str]]:
    found = []
    if args.imagenet16h:
        imagenet = cached(cache, f"imagenet16h_seed{args.seed}",
                          lambda: data.imagenet16h_setting(args.imagenet16h, [95, 125], seed=args.seed))
        found += [("ImageNet-16H 80 → 80 (no shift)", imagenet, "noise 80", "noise 80"),
                  ("ImageNet-16H 80 → 95", imagenet, "noise 80", "noise 95"),
                  ("ImageNet-16H 80 → 125", imagenet, "noise 80", "noise 125")]
    hate = cached(cache, f"hatespeech_seed{args.seed}", lambda: data.hatespeech_setting(seed=args.seed))
    mmlu = cached(cache, f"mmlu_seed{args.seed}", lambda: data.mmlu_setting(seed=args.seed))
    return found + [("HateSpeech (no shift)", hate, "no shift", "no shift"),
                    ("MMLU humanities → humanities (no shift)", mmlu, "humanities", "humanities"),
                    ("MMLU humanities → STEM", mmlu, "humanities", "STEM")]


def run_cbpe(args: argparse.Namespace, inputs: dict[str, np.ndarray]) -> tuple[dict[str, list], str]:
    """CBPE's estimated system error per window: NannyML's when --nannyml-python works, else re-implemented."""
    if args.nannyml_python:
        with tempfile.TemporaryDirectory() as folder:
            np.savez(Path(folder) / "streams.npz", **inputs)
            script = Path(__file__).resolve().parents[1] / "research" / "monitoring_cbpe.py"
            done = subprocess.run([args.nannyml_python, "-P", str(script), str(Path(folder) / "streams.npz"),
                                   str(Path(folder) / "cbpe.json")], capture_output=True, text=True)
            if done.returncode == 0:
                out = json.loads((Path(folder) / "cbpe.json").read_text())
                return out["estimates"], f"NannyML {out['nannyml']} CBPE"
            print(f"NannyML's CBPE failed, re-implementing it: {done.stderr.strip()[-500:]}", file=sys.stderr)
    names = sorted({key.split("/")[0] for key in inputs})
    return {name: cbpe_reimplemented(inputs[f"{name}/ref_p"], inputs[f"{name}/ref_y"], inputs[f"{name}/p"],
                                     int(inputs[f"{name}/window"])).tolist() for name in names}, \
        "CBPE re-implemented (isotonic recalibration on the reference set, then the mean per chunk), not NannyML's"


NUMBERS = re.compile(r"\[\s*((?:-?[0-9.eE+]+|null)(?:\s*,\s*(?:-?[0-9.eE+]+|null))*)\s*\]")


def compact_json(record: dict) -> str:
    """Indented JSON whose lists of numbers each take one line (the per-stream alarms and per-window estimates)."""
    return NUMBERS.sub(lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
                       json.dumps(record, indent=1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        record = json.loads((args.output_dir / "monitoring.json").read_text())
        plot_monitoring(record, args.output_dir / "monitoring.png")
        (args.output_dir / "monitoring.md").write_text(monitoring_markdown(record) + followup_markdown(record))
        return 0
    existing = [name for name in OUTPUTS if (args.output_dir / name).exists()]
    if existing and not args.overwrite:
        print(f"{args.output_dir} already holds {existing}: pass --overwrite to replace them.", file=sys.stderr)
        return 2
    cache = args.cache_dir or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hf_defer" / \
        "monitoring"
    started = time.time()
    rows, cbpe_inputs = [], {}
    for index, (name, setting, before, after) in enumerate(scenarios(args, cache)):
        targets = streams.certify(setting, args.budget, args.confidence)
        values = {label: streams.population_values(setting.populations[label], targets) for label in (before, after)}
        shifted = before != after
        harmful = shifted and (values[after]["deferral_rate"] > targets.max_deferral_rate
                               or values[after]["system_error"] > targets.max_error)
        t = time.time()
        result = streams.run_streams(setting, before, after, targets, streams=args.streams, pre=args.pre,
                                     post=args.post, batch=args.batch, window=args.window, audit_rate=args.audit_rate,
                                     seed=args.seed * 1000 + index, keep_rows=args.cbpe_streams)
        summary = streams.summarize(result, args.pre, harmful)
        key = f"s{index}"
        kept = result["kept_rows"]
        ref = setting.calibration.at(targets.threshold)
        cbpe_inputs.update({f"{key}/ref_p": 1.0 - ref["estimated"], f"{key}/ref_y": 1.0 - ref["loss"],
                            f"{key}/p": np.stack([r["p"] for r in kept]), f"{key}/y": np.stack([r["y"] for r in kept]),
                            f"{key}/window": np.asarray(args.window)})
        rows.append({"scenario": name, "key": key, "setting": setting.name, "description": setting.description,
                     "before": before, "after": after, "shifted": shifted, "harmful": harmful,
                     "targets": targets.__dict__, "population": values, "summary": summary,
                     # per window, on the streams also given to CBPE
                     "estimate": np.round(result["estimate"][:args.cbpe_streams], 5).tolist(),
                     "truth": result["truth"][:args.cbpe_streams].tolist(),
                     "alarms": result["alarm"], "naive": result["naive"],
                     "naive_bonferroni": result["naive_bonferroni"], "seconds": time.time() - t})
        print(f"{name}: {json.dumps(summary)} ({time.time() - t:.0f} s)", flush=True)
    cbpe, cbpe_name = run_cbpe(args, cbpe_inputs)
    for row in rows:
        row["cbpe"] = np.round(cbpe[row["key"]], 5).tolist()
    record = {
        "issue": 45, "date": datetime.date.today().isoformat(), "seconds": time.time() - started,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()
                     if key not in ("output_dir", "cache_dir", "imagenet16h", "nannyml_python", "overwrite")},
        "cbpe": cbpe_name, "scenarios": rows,
    }
    (args.output_dir / "monitoring.json").write_text(compact_json(record))
    plot_monitoring(record, args.output_dir / "monitoring.png")
    (args.output_dir / "monitoring.md").write_text(monitoring_markdown(record))
    print(f"wrote {', '.join(OUTPUTS)} to {args.output_dir} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
