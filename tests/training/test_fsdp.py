"""FSDP2 training of a deferral model on 2 CPU processes (gloo): the loss of every step and the trained weights are
those of one process without FSDP, a sharded checkpoint (one file per process) resumes to the same weights, and the
saved folder loads with `AutoModelForDeferral` and `pipeline("deferral")`. tests/scripts/fsdp2_train.py, run under
`torchrun`. (accelerate 1.15 does not shard on CPU processes: see examples/accelerate/fsdp.yaml.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import pipeline

from hf_defer import AutoModelForDeferral
from test_distributed import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "fsdp2_train.py"


def train(processes: int, output: Path, *flags: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "modeling"), os.environ.get("PYTHONPATH", "")])}
    report = output.parent / f"{output.name}-{len(flags)}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
               str(free_port()), str(SCRIPT), str(report), str(output), *flags]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow  # four launches of fresh interpreters: about a minute on 2 cores
def test_fsdp2_on_two_cpu_processes_trains_and_resumes_as_one_process(tmp_path):
    one = train(1, tmp_path / "one", "--plain")
    two = train(2, tmp_path / "two")
    assert (one["world_size"], two["world_size"]) == (1, 2) and two["sharded_parameters"] > 0
    assert two["losses"].keys() == one["losses"].keys()
    for step, loss in one["losses"].items():
        assert two["losses"][step] == pytest.approx(loss, abs=1e-5), step
    for name, value in one["weights"].items():
        assert two["weights"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
    # stopped after step 3 with a sharded checkpoint (one file per process), resumed by two fresh processes
    first = train(2, tmp_path / "resumed", "--stop-after", "3")
    assert list(first["losses"]) == ["1", "2", "3"]
    assert sorted(first["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    resumed = train(2, tmp_path / "resumed", "--resume")
    assert list(resumed["losses"]) == ["4", "5", "6"]
    for step, loss in resumed["losses"].items():
        assert loss == pytest.approx(one["losses"][step], abs=1e-5), step
    for name, value in one["weights"].items():
        assert resumed["weights"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
    # the saved folder is an ordinary deferral model
    texts = ["the cat sat on the mat", "a dog"]
    reference = pipeline("deferral", model=str(tmp_path / "one" / "final"))(texts)
    for folder in ("two", "resumed"):
        model = AutoModelForDeferral.from_pretrained(tmp_path / folder / "final")
        expected = AutoModelForDeferral.from_pretrained(tmp_path / "one" / "final")
        ids = torch.tensor([[2, 3, 4]])
        torch.testing.assert_close(model(input_ids=ids).logits, expected(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
        outputs = pipeline("deferral", model=str(tmp_path / folder / "final"))(texts)
        assert [out["label"] for out in outputs] == [out["label"] for out in reference]
        assert [out["class_score"] for out in outputs] == pytest.approx([out["class_score"] for out in reference],
                                                                        abs=1e-4)


@pytest.mark.slow  # six launches of fresh interpreters: about 80 s on 2 cores
def test_the_committed_fsdp_config_trains_resumes_and_saves_through_accelerate_on_cpu(tmp_path):
    """tests/scripts/fsdp_gpu_check.py --emulate-fsdp-on-cpu: accelerate's own FSDP2 preparation, checkpoints (full and
    sharded) and resume under DeferralTrainer, on one gloo process; every check of the GPU run passes."""
    script = ROOT / "tests" / "scripts" / "fsdp_gpu_check.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), "--device", "cpu", "--emulate-fsdp-on-cpu", "--skip-two-process",
                           "--out", str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    summary = json.loads((tmp_path / "fsdp_gpu.json").read_text())
    failed = [check["name"] + ": " + check["detail"] for check in summary["checks"] if not check["passed"]]
    assert done.returncode == 0 and summary["verdict"] == "EMULATED" and not failed, (failed, done.stdout[-2000:])
    names = {check["name"] for check in summary["checks"]}
    assert {"fsdp_engaged[fsdp_bf16]", "resume_weights[resume_fp32_sharded]", "loads[fsdp_bf16]"} <= names
    assert summary["runs"]["fsdp_bf16"]["report"]["dtensor_parameters"] > 0
