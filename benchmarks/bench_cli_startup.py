"""Start-up time of the `hf-defer` command: `--help`, `train --help` and a mistyped `train` flag, against `python -c
pass` (the floor: an interpreter that starts and exits), measured in one run, alternating the commands so that machine
load hits them alike.

Each `hf-defer` call runs what the console script runs (`from hf_defer.commands.cli import main`), so that the
`hf_defer` Python imports (the installed one, or the checkout on `PYTHONPATH`) is measured. `train` answers `--help` and unknown
flags from the flags its first full parse saved (`hf_defer.commands.flags.TrainFlags`): the script makes that first
call once, in a fresh cache, and reports it apart ("first `train --help`": imports torch and transformers).

Usage: .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HF_DEFER = [sys.executable, "-c", "import sys; from hf_defer.commands.cli import main; sys.exit(main())"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    options = parser.parse_args(argv)
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "hf-defer --help": [*HF_DEFER, "--help"],
        "hf-defer train --help": [*HF_DEFER, "train", "--help"],
        "hf-defer train --train_fiel x.csv ... (mistyped)": [
            *HF_DEFER, "train", "--model_name_or_path", "m", "--train_fiel", "x.csv", "--output_dir", "o"],
    }
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "HF_DEFER_CACHE": cache, "HF_HUB_OFFLINE": "1"}
        start = time.perf_counter()
        subprocess.run(commands["hf-defer train --help"], env=env, check=True, stdout=subprocess.DEVNULL)
        first = time.perf_counter() - start
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(options.repeats):
            for name, command in commands.items():
                start = time.perf_counter()
                subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times[name].append(time.perf_counter() - start)
    print("| command | median (s) | min (s) | max (s) | runs |\n| --- | --- | --- | --- | --- |")
    print(f"| first `hf-defer train --help` (full parse; saves the flags) | {first:.3f} | | | 1 |")
    for name, values in times.items():
        print(f"| `{name}` | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} "
              f"| {len(values)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
