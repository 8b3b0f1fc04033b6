"""scripts/cascade_hatespeech.py end to end on a tiny random encoder and a few hundred tweets: both stages."""

from __future__ import annotations

import os
import subprocess
import sys
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizer

from research.hatespeech_cascade import fold_of_rows

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cascade_hatespeech.py"
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a i you is are to and of rt bitch hoes not so my".split()]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))


def test_fold_of_rows_is_balanced_and_seeded():
    fold = fold_of_rows(10, 3, seed=0)
    assert sorted(np.bincount(fold).tolist()) == [3, 3, 4]
    assert fold.tolist() == fold_of_rows(10, 3, seed=0).tolist() != fold_of_rows(10, 3, seed=1).tolist()
    with pytest.raises(ValueError, match="folds"):
        fold_of_rows(10, 1, seed=0)


def run_script(argv: list[str]) -> None:
    """The script as a user runs it: a fresh interpreter, with this test's offline settings and cache."""
    subprocess.run([sys.executable, str(SCRIPT), *argv], check=True, env=dict(os.environ), capture_output=True,
                   text=True)


@pytest.mark.slow  # make test-slow (CI): the quick suite stays under 3 minutes on 2 cores
def test_both_stages_on_a_tiny_encoder(tmp_path):
    torch.manual_seed(0)
    encoder = tmp_path / "tiny"
    BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                         vocab_size=len(WORDS))).save_pretrained(encoder)
    BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)}).save_pretrained(encoder)
    predictions = tmp_path / "costly.json"
    common = ["--max-rows", "150", "--model", str(encoder), "--predictions", str(predictions)]
    run_script(["--stage", "costly", "--folds", "2", "--train-rows-per-fold", "40", "--max-length", "16", *common])
    payload = json.loads(predictions.read_text())
    assert len(payload["probs"]) == 150 and payload["settings"]["folds"] == 2
    assert np.allclose(np.sum(payload["probs"], axis=1), 1.0, atol=1e-3)
    run_script(["--stage", "compare", "--seeds", "0", "1", "--head-epochs", "2", "--output", str(tmp_path), *common])
    record = json.loads((tmp_path / "hatespeech_cascade.json").read_text())
    assert set(record["summary"]["area"]) == {"cheap-first cascade", "learned cascade", "route-only", "A-SM", "S-SM",
                                              "A-OvA", "confidence cascade", "router"}
    assert (tmp_path / "hatespeech_cascade.png").stat().st_size > 0
    text = (tmp_path / "hatespeech_cascade.md").read_text()
    assert "A-SM vs confidence cascade" in text and "A-SM vs router" in text and "A-SM vs S-SM" in text
    assert "learned cascade vs confidence cascade" in text and "learned cascade vs route-only" in text
