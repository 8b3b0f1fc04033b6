"""The follow-up to issue 45's monitoring results (results/monitoring.md, its last section): the same streams watched
by the monitor with its alarm processes starting every 50 rows (instead of at every row), by the same monitor given
the stream's length as its horizon, and the label-free estimate recalibrated on the calibration inputs (isotonic, as
NannyML's CBPE, where Cox's calibration test rejects the raw estimates), beside the first run's numbers (kept in
`monitoring.json`).

The streams are those of the first run (same seeds: the rows drawn do not depend on the monitor), which this script
checks against the recorded truth per window; CBPE's numbers are reused from the first run for that reason.

Usage: python research/monitoring_followup.py [--imagenet16h PATH] [--streams 500] [--output-dir results]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from research import monitoring_streams as streams  # noqa: E402
from research.monitoring_report import followup_markdown  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "scripts"))
    import monitoring as script

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imagenet16h", default=None)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "results")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)
    record_path = args.output_dir / "monitoring.json"
    record = json.loads(record_path.read_text())
    if not args.render_only:
        first = record["settings"]
        options = script.parse_args([] if args.imagenet16h is None else ["--imagenet16h", args.imagenet16h])
        options.seed = first["seed"]
        cache = args.cache_dir or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / \
            "hf_defer" / "monitoring"
        started = time.time()
        rows = []
        by_name = {row["scenario"]: row for row in record["scenarios"]}
        for index, (name, setting, before, after) in enumerate(script.scenarios(options, cache)):
            old = by_name[name]
            targets = streams.certify(setting, first["budget"], first["confidence"])
            t = time.time()
            result = streams.run_streams(setting, before, after, targets, streams=args.streams, pre=first["pre"],
                                         post=first["post"], batch=first["batch"], window=first["window"],
                                         audit_rate=first["audit_rate"], seed=first["seed"] * 1000 + index,
                                         followup=True)
            kept = min(args.streams, len(old["truth"]))
            if not np.allclose(result["truth"][:kept], np.asarray(old["truth"])[:kept]):
                raise SystemExit(f"{name}: the streams differ from the first run's; rerun scripts/monitoring.py.")
            summary = streams.summarize(result, first["pre"], old["harmful"])
            channels: dict[str, int] = {}
            for channel in result["channel_horizon"]:
                if channel is not None:
                    channels[channel] = channels.get(channel, 0) + 1
            summary["alarm_horizon_channels"] = channels
            rows.append({"scenario": name, "summary": summary, "seconds": time.time() - t,
                         "recalibration": result["recalibration"],
                         "estimate_recalibrated": np.round(result["estimate_recalibrated"][:kept], 5).tolist()})
            print(f"{name}: {json.dumps(summary)} ({time.time() - t:.0f} s)", flush=True)
        record["followup"] = {"streams": args.streams, "seconds": time.time() - started, "scenarios": rows}
        record_path.write_text(script.compact_json(record))
    text = (args.output_dir / "monitoring.md").read_text()
    marker = "\n## Follow-up"
    text = text.split(marker)[0].rstrip("\n") + "\n" + followup_markdown(record)
    (args.output_dir / "monitoring.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
