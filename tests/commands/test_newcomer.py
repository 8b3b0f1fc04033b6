"""What a newcomer trips on (issue 35): rows held out only when something uses them, unknown flags named first and
answered before torch is imported, a Hub name offline, the README's folders, the margin in predictions, quiet runs."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pandas as pd
import pytest

from hf_defer.commands.cli import main as hf_defer_main
from test_run import COMMON, data, data_flags  # noqa: F401  (fixture)


def kept_rows(csv_file: Path) -> int:
    """Rows of a test CSV that `--missing_expert drop` keeps: alice answered and bob is not -1."""
    frame = pd.read_csv(csv_file)
    return int((frame["alice"].notna() & (frame["bob"].astype(str) != "-1")).sum())


def train_only_flags(data: Path) -> list[str]:
    flags = data_flags(data)
    for flag in ("--validation_file", "--test_file"):
        del flags[flags.index(flag):flags.index(flag) + 2]
    return flags


# ------------------------------------------------------------------------------------- 2. held-out rows
def test_rows_are_held_out_only_when_something_uses_them(data, tmp_path, caplog):
    base = ["train", "--model_name_or_path", str(data / "encoder"), *train_only_flags(data), "--do_train",
            "--num_train_epochs", "1", *COMMON]
    with caplog.at_level(logging.WARNING):
        assert hf_defer_main([*base, "--output_dir", str(tmp_path / "all")]) == 0
    assert "held out" not in caplog.text
    results = json.loads((tmp_path / "all" / "all_results.json").read_text())
    assert results["train_samples"] == kept_rows(data / "train.csv")  # every row trains
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert hf_defer_main([*base, "--do_eval", "--max_deferral_rate", "0.5",
                              "--output_dir", str(tmp_path / "held")]) == 0
    total = len(pd.read_csv(data / "train.csv"))
    held = math.ceil(total * 0.1)  # datasets' train_test_split rounds the test share up
    assert (f"held out {held} of the {total} training rows (--validation_split_percentage 10) as the validation split, "
            "for evaluation (--do_eval, --eval_strategy) and calibrating the deferral threshold (--max_deferral_rate)"
            ) in caplog.text
    results = json.loads((tmp_path / "held" / "all_results.json").read_text())
    assert results["train_samples"] + results["eval_samples"] == kept_rows(data / "train.csv")
    assert results["eval_samples"] <= held
