"""Start-up time of the `hf-defer` command: `hf-defer --help` against `python -c pass` (the floor: an interpreter
that starts and exits) and `python -m hf_defer --help` (which imports the package, torch included), measured in one
run, alternating the three so that machine load hits them alike.

Usage: .venv/bin/python benchmarks/bench_cli_startup.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    options = parser.parse_args(argv)
    cli = Path(sys.executable).parent / "hf-defer"
    commands = {"python -c pass": [sys.executable, "-c", "pass"], "hf-defer --help": [str(cli), "--help"],
                "python -m hf_defer --help": [sys.executable, "-m", "hf_defer", "--help"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(options.repeats):
        for name, command in commands.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    print("| command | median (s) | min (s) | runs |\n| --- | --- | --- | --- |")
    for name, values in times.items():
        print(f"| `{name}` | {statistics.median(values):.3f} | {min(values):.3f} | {len(values)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
