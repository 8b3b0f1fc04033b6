"""scripts/finetune_decoder_lora.py runs end to end on CPU with a tiny Qwen2 (`--tiny`) on a small CSV in the format
of the HateSpeech data, and writes the JSON the GPU run writes."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import peft  # noqa: F401  (a test dependency, pyproject [test])
from script_loader import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "finetune_decoder_lora.py"
WORDS = "you are so bad good the a hate love this that what is not very big small dog cat day night".split()


def hatespeech_like_csv(path: Path, rows: int = 60, seed: int = 0) -> Path:
    """Davidson's columns: an unnamed index, count, the three annotator counts, class (the majority), tweet."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(3, [0.1, 0.6, 0.3], size=rows)
    lines = [",count,hate_speech,offensive_language,neither,class,tweet"]
    for i, row in enumerate(counts):
        tweet = " ".join(rng.choice(WORDS, size=rng.integers(3, 12)))
        lines.append(f"{i},3,{row[0]},{row[1]},{row[2]},{int(np.argmax(row))},{tweet}")
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":  # the compressed copy the GPU machine gets
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def run_script(argv: list[str]) -> None:
    """The script as a user runs it: a fresh interpreter, offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, str(SCRIPT), *argv], check=True, env=env, capture_output=True, text=True)


def test_the_gpu_model_is_qwen2_0_5b_sized():
    # built on the meta device (no memory): the backbone has Qwen2-0.5B's published 494,032,768 parameters, and the
    # head adds 896 x (3 + 1) weights and 4 biases
    script = load_script(SCRIPT.name)
    model = script.build_model(types.SimpleNamespace(eos_token_id=0), tiny=False, device=torch.device("meta"))
    assert sum(p.numel() for p in model.encoder.parameters()) == 494_032_768
    assert sum(p.numel() for p in model.parameters()) == 494_032_768 + 896 * 4 + 4


@pytest.mark.slow  # make test-slow (CI): the quick suite stays under 3 minutes on 2 cores
def test_tiny_cpu_run_writes_metrics_speed_and_parameter_counts(tmp_path):
    data = hatespeech_like_csv(tmp_path / "labeled_data.csv.gz")
    output = tmp_path / "results" / "tiny.json"
    run_script(["--data", str(data), "--tiny", "--max-steps", "3", "--batch-size", "8",
                "--output", str(output), "--output-dir", str(tmp_path / "trainer")])
    results = json.loads(output.read_text())
    assert results["steps"] == 3 and results["steps_per_second"] > 0 and results["peak_gpu_memory_gib"] is None
    assert 0 < results["trainable_parameters"] < results["parameters"]
    assert results["num_test_examples"] == 12  # 20 % of 60
    for name in ("test_system_error", "test_coverage", "test_classifier_error", "test_expert_ece"):
        assert 0.0 <= results["test"][name] <= 1.0, name
    assert np.isfinite(results["test"]["test_loss"]) and all(np.isfinite(results["first_and_last_logged_loss"]))
