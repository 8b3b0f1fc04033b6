"""`hf-defer train` / scripts/run_deferral.py with sparse annotations (`--missing_expert mask`) and an expert judged by a
score (`--expert_correct_columns`), end to end on a tiny encoder, offline; and the flags' errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hf_defer.commands.arguments import parse_run_arguments
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

WORDS = "good bad great awful fine movie plot actor boring fun".split()
CLASSES = ["negative", "positive"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A tiny BERT and train/dev CSVs: alice answers 60 % of the rows, bob all of them, and a judge grades 70 %."""
    root = tmp_path_factory.mktemp("sparse")
    save_tiny_bert(root / "encoder", WORDS)
    rng = np.random.default_rng(0)
    for split, n in (("train", 32), ("dev", 16)):
        y = rng.integers(0, 2, n)
        pd.DataFrame({"review": [" ".join(rng.choice(WORDS, size=3)) for _ in range(n)],
                      "label": [CLASSES[v] for v in y],
                      "alice": [CLASSES[v] if rng.random() < 0.6 else None for v in y],
                      "bob": [CLASSES[rng.integers(0, 2)] for _ in y],
                      "judge": [round(float(rng.random()), 2) if rng.random() < 0.7 else None for _ in y],
                      }).to_csv(root / f"{split}.csv", index=False)
    return root


def test_train_with_masked_answers_and_a_judged_expert(data, tmp_path):
    out = tmp_path / "model"
    argv = ["train", "--model_name_or_path", str(data / "encoder"), "--train_file", str(data / "train.csv"),
            "--validation_file", str(data / "dev.csv"), "--text_column_name", "review",
            "--expert_column_names", "alice,bob", "--expert_correct_columns", "judge", "--missing_expert", "mask",
            "--max_seq_length", "8", "--do_train", "--do_eval", "--num_train_epochs", "1", "--output_dir", str(out),
            "--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true",
            "--per_device_train_batch_size", "8"]
    assert hf_defer_main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["expert_names"] == ["alice", "bob", "judge"] and config["num_experts"] == 3
    results = json.loads((out / "all_results.json").read_text())
    assert {"eval_expert_ece_alice", "eval_expert_ece_judge", "eval_deferral_rate_bob"} <= set(results)
    assert 0 <= results["eval_system_error"] <= 1


def test_the_flags_of_sparse_data():
    common = ["--model_name_or_path", "m", "--train_file", "t.csv", "--output_dir", "o"]
    _, data_args, _ = parse_run_arguments([*common, "--expert_correct_columns", "judge, tests", "--missing_expert",
                                           "mask"])
    assert data_args.correct_columns == ["judge", "tests"] and data_args.expert_columns == []
    with pytest.raises(ValueError, match="--missing_expert must be 'error', 'drop' or 'mask', got 'skip'"):
        parse_run_arguments([*common, "--expert_column_names", "a", "--missing_expert", "skip"])
    with pytest.raises(ValueError, match="--expert_correct_columns"):
        parse_run_arguments(common)
