"""Folders saved by an earlier layout of hf_defer keep loading: `tests/fixtures/saved_before_layout/` was written by
the flat-module code (commit in `saved_before_layout.json`, script `make_saved_before_layout.py`), with its `auto_map`
naming the eight code files at the folder's top level, and its pipeline outputs recorded then."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, pipeline

import hf_defer
from test_sharing import REMOTE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = json.loads((FIXTURES / "saved_before_layout.json").read_text())


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    copy = tmp_path / "saved"
    shutil.copytree(FIXTURES / "saved_before_layout", copy)
    return copy


def assert_same_outputs(got: list[dict], want: list[dict]) -> None:
    assert [o["label"] for o in got] == [o["label"] for o in want]
    for g, w in zip(got, want):
        assert g["expert"] == w["expert"] and g["class_label"] == w["class_label"]
        assert g["expert_accuracy"] == pytest.approx(w["expert_accuracy"], abs=1e-6)
        assert g["scores"] == pytest.approx(w["scores"], abs=1e-6)


def test_library_mode_loads_a_folder_saved_by_the_flat_layout(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_deferral.EncoderForDeferral"  # the old top-level file names
    outputs = pipeline("deferral", model=str(folder))(RECORDED["texts"], expert_costs=RECORDED["expert_costs"])
    assert_same_outputs(outputs, RECORDED["pipeline"])
    model = hf_defer.AutoModelForDeferral.from_pretrained(folder).eval()
    assert type(model) is hf_defer.EncoderForDeferral
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = model(**tokenizer(RECORDED["texts"], return_tensors="pt", padding=True)).logits
    np.testing.assert_allclose(logits.numpy(), RECORDED["logits"], atol=1e-5)


@pytest.mark.slow  # a fresh interpreter or process: make test-slow (CI) runs it
def test_remote_code_mode_loads_a_folder_saved_by_the_flat_layout(folder, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), TOKENIZERS_PARALLELISM="false")
    run = subprocess.run([sys.executable, "-c", REMOTE, str(folder), json.dumps(RECORDED["texts"])], cwd=tmp_path,
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout.split("RESULT", 1)[1])
    assert remote["hf_defer_modules"] == [] and remote["model_class"].startswith("transformers_modules.")
    assert RECORDED["expert_costs"] == [0.0, 0.1]  # the costs REMOTE passes
    assert_same_outputs(remote["pipeline"], RECORDED["pipeline"])
    # Its remote code predates the registration of the task "deferral" (README: use pipeline(model=...) for it).
    assert remote["task_pipeline_class"].startswith("KeyError") and "Unknown task deferral" in remote["task_pipeline_class"]
    np.testing.assert_allclose(remote["logits"], RECORDED["logits"][0], atol=1e-5)
