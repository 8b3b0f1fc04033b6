"""Runs that must not look fine when they are not (issue 36): a run without stage flags trains (and says so), an
untrained head is never evaluated or saved, a mistyped model folder is named as such (with the Hub id tried and why it
failed) at once, a failed upload keeps the model and says where, and `hf_defer_run.json` says how every started run
ended: completed, failed (with the error) or interrupted. Tiny BERT, offline."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import TrainingArguments

import hf_defer
from hf_defer.commands.cli import main as hf_defer_main
from hf_defer.commands.run_checks import check_stages, default_stages
from test_cli import one_error_line
from tiny_bert import save_tiny_bert
from unreachable_hub import CLOSED_PORT, here, offline, online_but_unreachable  # noqa: F401 (fixtures)

WORDS = "good bad great awful fine movie plot actor boring fun".split()
CLASSES = ["negative", "neutral", "positive"]
QUICK = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
         "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_length", "8",
         "--num_train_epochs", "1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("outcomes")
    save_tiny_bert(root / "encoder", WORDS)
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("dev", 8), ("test", 8)):
        y = rng.integers(0, 3, n)
        pd.DataFrame({"text": [" ".join(rng.choice(WORDS, size=4)) for _ in range(n)],
                      "label": [CLASSES[v] for v in y],
                      "alice": [CLASSES[v] for v in y], "bob": [CLASSES[rng.integers(0, 3)] for _ in y]},
                     ).to_csv(root / f"{split}.csv", index=False)
    return root


def train_flags(data: Path, out: Path, *stages: str) -> list[str]:
    return ["train", "--model_name_or_path", str(data / "encoder"), "--train_file", str(data / "train.csv"),
            "--validation_file", str(data / "dev.csv"), "--test_file", str(data / "test.csv"),
            "--expert_column_names", "alice,bob", *stages, "--output_dir", str(out), *QUICK]


def record(out: Path) -> dict:
    return json.loads((out / "hf_defer_run.json").read_text())


def last_line(err: str) -> str:
    return [line for line in err.replace("\r", "\n").splitlines() if line.strip()][-1]


# 1. Which stages run


@pytest.mark.parametrize("flags, expected", [
    ({}, ["do_train", "do_eval", "do_predict"]),  # nothing named: everything the data allows
    ({"eval_strategy": "epoch"}, ["do_train", "do_predict"]),  # evaluating while training asks for training
    ({"do_train": True}, []),  # named stages are left as they are
    ({"do_train": True, "do_predict": True}, []),
])
def test_default_stages_train_when_no_stage_is_named(flags, expected, tmp_path):
    args = TrainingArguments(str(tmp_path), report_to=[], **flags)
    assert default_stages(args, {"train": 0, "validation": 0, "test": 0}) == expected
    assert args.do_train  # every case here trains


def test_no_stage_and_no_train_split_is_refused(tmp_path):
    args = TrainingArguments(str(tmp_path), report_to=[])
    with pytest.raises(ValueError, match="nothing to train: the data has the split.s. validation, test but no training"):
        default_stages(args, {"validation": 0, "test": 0})
    assert not args.do_train


@pytest.mark.parametrize("flags", [{"do_eval": True}, {"do_predict": True}, {"do_eval": True, "do_predict": True}])
def test_evaluating_or_predicting_without_training_is_refused(flags, tmp_path):
    with pytest.raises(ValueError, match="without --do_train would evaluate and save an untrained deferral head"):
        check_stages(TrainingArguments(str(tmp_path), report_to=[], **flags))
    check_stages(TrainingArguments(str(tmp_path), report_to=[], do_train=True, **flags))  # with training: fine


def test_a_run_without_stage_flags_trains_evaluates_predicts_and_says_so(data, tmp_path, caplog):
    out = tmp_path / "model"
    assert hf_defer_main(train_flags(data, out)) == 0
    assert "no --do_train given: running --do_train --do_eval --do_predict" in caplog.text
    summary = record(out)
    assert summary["status"] == "completed" and set(summary["metrics"]) >= {"train", "eval", "test"}
    assert summary["metrics"]["train"]["steps"] == 3  # 24 rows, batch 8, one epoch: the head was trained
    assert (out / "predictions.csv").is_file()


def test_a_run_that_would_train_nothing_stops_before_writing(data, tmp_path, capsys):
    out = tmp_path / "model"
    assert hf_defer_main(train_flags(data, out, "--do_eval", "--do_predict")) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "--do_eval and --do_predict without --do_train" in line and "add --do_train" in line
    assert not out.exists()


# 2. A mistyped model folder


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_mistyped_folder_is_named_with_the_hub_id_tried_offline(here, offline, capsys, command):
    start = time.perf_counter()
    assert hf_defer_main([command, "--model", "ann-modle", "--input", "input.csv"]) == 2
    assert time.perf_counter() - start < 5  # no retries
    line = one_error_line(capsys.readouterr().err, command)
    assert f"--model 'ann-modle': no folder 'ann-modle' exists in {here}" in line
    assert "(did you mean 'ann-model'?)" in line
    assert "as a Hub id, 'ann-modle' is not in the local Hub cache" in line and "HF_HUB_OFFLINE=1" in line


def test_a_mistyped_folder_with_the_hub_unreachable_fails_at_once(here, online_but_unreachable, capsys):
    start = time.perf_counter()
    assert hf_defer_main(["predict", "--model", "ann-modle", "--input", "input.csv"]) == 2
    assert time.perf_counter() - start < 5  # one attempt, not a minute of retries
    line = one_error_line(capsys.readouterr().err, "predict")
    assert "no folder 'ann-modle' exists" in line
    assert f"as a Hub id, 'ann-modle' could not be looked up at {CLOSED_PORT} (ConnectError" in line


def test_train_names_a_mistyped_encoder_folder_before_writing(data, here, offline, capsys):
    argv = train_flags(data, here / "out", "--do_train")
    argv[argv.index("--model_name_or_path") + 1] = "encodr"
    assert hf_defer_main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "--model_name_or_path 'encodr': no folder 'encodr' exists" in line and "as a Hub id" in line
    assert not (here / "out").exists()


# 3. A failed upload, a failure, an interruption


@pytest.mark.parametrize("hub", ["offline", "online_but_unreachable"])
def test_a_failed_upload_keeps_the_model_and_records_the_failure(data, tmp_path, capsys, caplog, request, hub):
    request.getfixturevalue(hub)
    out = tmp_path / "model"
    argv = train_flags(data, out, "--do_train", "--do_eval", "--push_to_hub", "--hub_model_id", "me/reviews")
    assert hf_defer_main(argv) == 2
    err = capsys.readouterr().err
    line = last_line(err)
    assert line.startswith("hf-defer train: error: --push_to_hub: the model is saved in ")
    assert f"the model is saved in {out.resolve()}, but uploading it to the Hub repository 'me/reviews' failed" in line
    assert f"upload it later with `hf upload me/reviews {out.resolve()}`" in line
    assert "Traceback" not in err
    assert "the upload is tried again at the end" in caplog.text  # said before training, which went on
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    summary = record(out)
    assert summary["status"] == "failed" and "uploading it to the Hub repository 'me/reviews' failed" in summary["error"]
    assert summary["model"] == str(out.resolve()) and summary["metrics"]["train"]["steps"] == 3


def test_ctrl_c_is_one_line_and_recorded_as_interrupted(data, tmp_path, capsys, monkeypatch):
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_defer.DeferralTrainer, "train", interrupted)
    out = tmp_path / "model"
    assert hf_defer_main(train_flags(data, out, "--do_train")) == 130
    assert last_line(capsys.readouterr().err) == "hf-defer train: interrupted"
    summary = record(out)
    assert summary["status"] == "interrupted" and "KeyboardInterrupt" in summary["error"]


def test_any_failure_after_the_start_is_recorded(data, tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("out of memory on the device")

    monkeypatch.setattr(hf_defer.DeferralTrainer, "evaluate", broken)
    out = tmp_path / "model"
    with pytest.raises(RuntimeError):
        hf_defer_main(train_flags(data, out, "--do_train", "--do_eval"))
    summary = record(out)
    assert summary == {"written_by": "hf_defer", "status": "failed",
                       "error": "RuntimeError: out of memory on the device", "files": summary["files"]}
