"""`accelerate launch` with DDP on two CPU processes trains a LoRA deferral model to the same evaluation numbers as
one process (same global batch): tests/scripts/lora_ddp.py, run in subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import peft  # noqa: F401  (a test dependency, pyproject [test])

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "lora_ddp.py"


def run(command: list[str], output: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           # the checkout, and the tests folder whose tiny model and data the script reuses
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "modeling"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*command, str(SCRIPT), str(output)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(output.read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # two launches of fresh interpreters: about a minute on 2 cores
def test_accelerate_ddp_on_two_cpu_processes_matches_one_process(tmp_path):
    one = run([sys.executable], tmp_path / "one.json")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port())]
    two = run(launch, tmp_path / "two.json")
    assert (one["world_size"], two["world_size"]) == (1, 2)
    for name in ("eval_system_error", "eval_coverage", "eval_classifier_error", "eval_budgeted_error_10"):
        assert two["metrics"][name] == one["metrics"][name], name
    for name in ("eval_loss", "eval_expert_ece"):
        assert two["metrics"][name] == pytest.approx(one["metrics"][name], abs=1e-6), name
    assert one["weights"].keys() == two["weights"].keys()
    for name, value in one["weights"].items():  # the same trained adapter and head
        assert two["weights"][name] == pytest.approx(value, abs=1e-5), name
