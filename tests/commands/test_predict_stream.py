"""`hf-defer predict` on files larger than memory: inputs read in chunks, decisions written in input order as they
come (CSV, JSON Lines, Parquet), a killed run resumed to the identical file, two processes giving the one-process
file. A head-only model over 4 features (no tokenizer: fast); the expected decisions come from calling the pipeline
on all the vectors at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from transformers import pipeline

from hf_defer import DeferralConfig, EncoderForDeferral, save_for_hub
from hf_defer.commands.cli import main as hf_defer_main
from hf_defer.commands.outputs import provenance_path, read_provenance, resume_predictions
from hf_defer.commands.predict import predict_file

ROWS = 61  # chunks of 8 rows: the last one partial
CLI = Path(sys.executable).parent / "hf-defer"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = DeferralConfig(feature_size=4, num_labels=3, num_experts=2, expert_names=["alice", "bob"],
                            id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
    folder = tmp_path_factory.mktemp("feature-model") / "model"
    save_for_hub(EncoderForDeferral(config), folder)
    return folder


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A Parquet file: ids (strings), 4-feature vectors, a text column to copy (one cell a formula)."""
    features = np.random.default_rng(0).normal(size=(ROWS, 4)) * 3
    frame = pd.DataFrame({"id": [f"r{i:03d}" for i in range(ROWS)], "features": list(features),
                          "note": ["=1+2" if i == 3 else f"n{i}" for i in range(ROWS)]})
    path = tmp_path_factory.mktemp("input") / "items.parquet"
    frame.to_parquet(path)
    return path, features


def expected(model: Path, features: np.ndarray) -> list[dict]:
    return pipeline("deferral", model=str(model))([list(row) for row in features], batch_size=ROWS,
                                                  return_margin=True)


def test_each_output_format_holds_the_pipeline_decisions_in_input_order(model, table, tmp_path):
    path, features = table
    want = expected(model, features)
    frames = {}
    for name in ("p.csv", "p.jsonl", "p.parquet"):
        assert predict_file(str(model), str(path), str(tmp_path / name), batch_size=3, chunk_size=8,
                            copy_columns=["note"]) == ROWS
    frames["csv"] = pd.read_csv(tmp_path / "p.csv", keep_default_na=False)
    frames["jsonl"] = pd.read_json(tmp_path / "p.jsonl", lines=True)
    frames["parquet"] = pd.read_parquet(tmp_path / "p.parquet")
    for kind, frame in frames.items():
        assert list(frame.columns) == ["id", "note", "label", "defer", "expert", "class_label", "class_score",
                                       "margin", "expert_accuracy_alice", "expert_accuracy_bob"], kind
        assert list(frame["id"]) == [f"r{i:03d}" for i in range(ROWS)], kind
        assert list(frame["label"]) == [out["label"] for out in want], kind
        assert [bool(value) for value in frame["defer"]] == [out["defer"] for out in want], kind
        assert list(frame["class_score"]) == pytest.approx([out["class_score"] for out in want], abs=1e-6), kind
        assert list(frame["margin"]) == pytest.approx([out["margin"] for out in want], abs=1e-6), kind
        assert list(frame["expert_accuracy_bob"]) == pytest.approx([out["expert_accuracy"][1] for out in want],
                                                                   abs=1e-6), kind
    assert frames["csv"]["note"][3] == "'=1+2" and frames["jsonl"]["note"][3] == "=1+2"  # spreadsheet-safe CSV only
    assert frames["parquet"]["note"][3] == "=1+2" and frames["parquet"]["class_score"].dtype == np.float64
    experts = pq.read_table(tmp_path / "p.parquet").column("expert").to_pylist()  # null where nobody is asked
    assert experts == [out["expert"] for out in want] and frames["parquet"]["defer"].dtype == bool


def test_a_csv_of_json_feature_lists_and_a_bad_vector_naming_its_row(model, table, tmp_path):
    path, features = table
    frame = pd.DataFrame({"vector": [json.dumps(list(row)) for row in features]})
    frame.to_csv(tmp_path / "x.csv", index=False)
    assert predict_file(str(model), str(tmp_path / "x.csv"), str(tmp_path / "p.csv"), chunk_size=8,
                        features_column_name="vector") == ROWS
    got = pd.read_csv(tmp_path / "p.csv")
    assert list(got["row"]) == list(range(ROWS))  # no id column: the row number
    assert list(got["class_score"]) == pytest.approx([out["class_score"] for out in expected(model, features)],
                                                     abs=1e-6)
    frame.loc[37, "vector"] = "not a vector"
    frame.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=r"--input .*bad.csv, column 'vector', row 37: expected a feature vector"):
        predict_file(str(model), str(tmp_path / "bad.csv"), str(tmp_path / "q.csv"), chunk_size=8,
                     features_column_name="vector")
    assert len(pd.read_csv(tmp_path / "q.csv")) == 32  # the whole chunks before row 37: what --resume keeps
    with pytest.raises(ValueError, match="--features_column_name 'features' is not a column"):
        predict_file(str(model), str(tmp_path / "x.csv"), str(tmp_path / "r.csv"))
    assert not (tmp_path / "r.csv").exists()  # refused before anything was written


@pytest.mark.parametrize("name", ["p.csv", "p.jsonl"])
def test_resume_after_a_cut_anywhere_gives_the_uninterrupted_file(model, table, tmp_path, name):
    path, _ = table
    whole = tmp_path / f"whole-{name}"
    predict_file(str(model), str(path), str(whole), batch_size=5, chunk_size=8, copy_columns=["note"])
    reference = whole.read_bytes()
    lines = reference.splitlines(keepends=True)
    row_end = sum(len(line) for line in lines[:11])  # exactly after a whole row
    for cut in (3, row_end, row_end + 17, len(reference) - 2):  # in the header (CSV), at a row end, inside rows
        out = tmp_path / name
        out.write_bytes(reference[:cut])
        provenance_path(out).write_bytes(provenance_path(whole).read_bytes())  # the record travels with the file
        predict_file(str(model), str(path), str(out), batch_size=5, chunk_size=8, copy_columns=["note"], resume=True)
        assert out.read_bytes() == reference, cut
    with pytest.raises(ValueError, match="--resume continues --output and --overwrite replaces it"):
        predict_file(str(model), str(path), str(out), resume=True, overwrite=True)


def test_resume_refuses_another_inputs_rows_and_other_columns(model, table, tmp_path):
    path, features = table
    out = tmp_path / "p.csv"
    predict_file(str(model), str(path), str(out), chunk_size=8)
    text = out.read_bytes().decode()
    out.write_bytes(text.replace("r005", "x005").encode())
    with pytest.raises(ValueError, match=r"--resume: the \d+ rows of --output .* do not hold the ids of the first"):
        predict_file(str(model), str(path), str(out), chunk_size=8, resume=True)
    out.write_bytes(text.encode())
    with pytest.raises(ValueError, match=r"--resume: .* was written with the columns \[\"id\", \"label\".*this run "
                                         r"uses \[\"id\", \"note\", \"label\""):
        predict_file(str(model), str(path), str(out), chunk_size=8, copy_columns=["note"], resume=True)
    lines = text.split("\n")
    out.write_bytes("\n".join([*lines[:4], "r003,x\r", *lines[5:8]]).encode())  # a short row inside: not a killed run's
    with pytest.raises(ValueError, match=r"--resume: row 3 \(counting from 0\) of .* does not have the columns"):
        resume_predictions(out, ["id", "label", "defer", "expert", "class_label", "class_score", "margin",
                                 "expert_accuracy_alice", "expert_accuracy_bob"])
    with pytest.raises(ValueError, match="Parquet, which is only readable once complete|a Parquet file is only"):
        predict_file(str(model), str(path), str(tmp_path / "p.parquet"), resume=True)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory) -> Path:
    """Another model with the same experts and classes: other weights only."""
    torch.manual_seed(1)
    config = DeferralConfig(feature_size=4, num_labels=3, num_experts=2, expert_names=["alice", "bob"],
                            id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
    folder = tmp_path_factory.mktemp("other-model") / "model"
    save_for_hub(EncoderForDeferral(config), folder)
    return folder


def _refused(argv: list[str], capsys) -> str:
    """The CLI's one-line refusal (exit status 2)."""
    capsys.readouterr()
    assert hf_defer_main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]  # beside it, at most the loading progress bar
    assert len(errors) == 1 and "Traceback" not in err and err.strip().endswith(errors[0]), err
    return errors[0]


@pytest.mark.parametrize("name", ["p.csv", "p.jsonl", "p.json", "p.parquet"])
def test_resume_never_touches_a_file_it_cannot_prove_it_wrote(model, table, tmp_path, capsys, name):
    path, _ = table
    out = tmp_path / name
    argv = ["predict", "--model", str(model), "--input", str(path), "--output", str(out), "--resume"]
    one_line = {"csv": b"my notes, do not lose", "jsonl": b'{"note": "mine"}', "json": b'{"note": "mine"}',
                "parquet": b"PAR1 not quite"}[name.rsplit(".", 1)[1]]
    for content in (one_line, one_line + b"\n", b"id,label\r\nr000,neg\r\n"):  # no line end, one, a CSV-like file
        out.write_bytes(content)
        err = _refused(argv, capsys)
        assert str(out) in err and ("--overwrite" in err or "Parquet" in err), err
        assert out.read_bytes() == content and not provenance_path(out).exists()  # untouched, nothing beside it
    # a file hf_defer wrote, its record replaced by someone else's JSON: not hf_defer's any more
    out.unlink()
    predict_file(str(model), str(path), str(out), chunk_size=8)
    provenance_path(out).write_text('{"written_by": "me"}')
    before = out.read_bytes()
    err = _refused(argv, capsys)
    assert out.read_bytes() == before and str(out) in err
    # a file named like the record, not hf_defer's, is not replaced by a new run either
    fresh = tmp_path / f"new-{name}"
    provenance_path(fresh).write_text("my notes")
    with pytest.raises(FileExistsError, match="exists and is not hf_defer's; pass --overwrite"):
        predict_file(str(model), str(path), str(fresh), chunk_size=8)
    assert provenance_path(fresh).read_text() == "my notes" and not fresh.exists()


@pytest.mark.parametrize("name", ["p.csv", "p.jsonl", "p.parquet"])
def test_resume_refuses_another_model_input_threshold_or_costs(model, other_model, table, tmp_path, capsys, name):
    """A file cut in half is continued only by the run that wrote it: another model with the same experts, another
    input with the same ids, another threshold or other costs are refused and the file is left as it was."""
    path, features = table
    out = tmp_path / name
    predict_file(str(model), str(path), str(out), chunk_size=8)
    whole = out.read_bytes()
    record = read_provenance(out)
    assert record["defer_threshold"] == 0.0 and record["expert_costs"] == [0.0, 0.0]  # what the decisions used
    assert record["model"]["name"] == str(model) and len(record["model"]["weights_sha256"]) == 64
    if name.endswith(".parquet"):
        cut = whole  # a Parquet file is only readable once complete: never continued
    else:
        lines = whole.splitlines(keepends=True)
        cut = b"".join(lines[:31])  # the first 30 rows (CSV: and the header)
        out.write_bytes(cut)
    other_input = tmp_path / "other.parquet"  # the same ids, other vectors
    pd.DataFrame({"id": [f"r{i:03d}" for i in range(ROWS)], "features": list(features[::-1].copy())}).to_parquet(
        other_input)
    base = ["predict", "--input", str(path), "--output", str(out), "--resume"]
    cases = {"the model": ["--model", str(other_model)],
             "the input": ["--model", str(model), "--input", str(other_input)],
             "the deferral threshold": ["--model", str(model), "--defer_threshold", "0.05"],
             "the expert costs": ["--model", str(model), "--expert_costs", "0.1,0"]}
    for what, flags in cases.items():
        err = _refused([*base, *flags], capsys)
        assert str(out) in err, err
        if not name.endswith(".parquet"):
            assert f"was written with {what}" in err, err
        assert out.read_bytes() == cut, what
    if not name.endswith(".parquet"):  # the same run goes on to the uninterrupted file
        assert hf_defer_main([*base, "--model", str(model)]) == 0
        assert out.read_bytes() == whole
        moved = tmp_path / "moved"  # the same model copied elsewhere is the same model
        import shutil
        shutil.copytree(model, moved)
        out.write_bytes(cut)
        assert hf_defer_main([*base, "--model", str(moved)]) == 0 and out.read_bytes() == whole


@pytest.mark.slow  # three runs of the command, one killed: about 40 s on 2 busy cores
def test_a_killed_command_resumes_to_the_identical_file(model, tmp_path):
    rows = 12_000
    features = np.random.default_rng(1).normal(size=(rows, 4))
    pd.DataFrame({"features": list(features)}).to_parquet(tmp_path / "big.parquet")
    flags = ["predict", "--model", str(model), "--input", str(tmp_path / "big.parquet"), "--batch_size", "256"]
    assert hf_defer_main([*flags, "--output", str(tmp_path / "whole.jsonl")]) == 0
    process = subprocess.Popen([str(CLI), *flags, "--output", str(tmp_path / "cut.jsonl")], env=ENV,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not (tmp_path / "cut.jsonl").exists()
                                           or os.path.getsize(tmp_path / "cut.jsonl") < 60_000):
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = os.path.getsize(tmp_path / "cut.jsonl")
    assert 0 < kept < os.path.getsize(tmp_path / "whole.jsonl"), "the run ended before it was killed"
    done = subprocess.run([str(CLI), *flags, "--output", str(tmp_path / "cut.jsonl"), "--resume"], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cut.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert "Deciding:" not in done.stderr and "\r" not in done.stderr  # stderr is a pipe: no progress bar in a log
    assert f"wrote {rows} decisions" in done.stderr


@pytest.mark.slow  # two interpreters under accelerate launch: about 30 s
def test_two_processes_write_the_one_process_file(model, table, tmp_path):
    path, _ = table
    flags = ["predict", "--model", str(model), "--input", str(path), "--batch_size", "4", "--copy_columns", "note"]
    assert hf_defer_main([*flags, "--output", str(tmp_path / "one.csv")]) == 0
    done = subprocess.run([str(CLI), *flags, "--output", str(tmp_path / "two.csv"), "--num_processes", "2"], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(f"wrote {ROWS} decisions") == 1  # the main process writes and reports
    one, two = pd.read_csv(tmp_path / "one.csv"), pd.read_csv(tmp_path / "two.csv")
    assert list(two.columns) == list(one.columns)
    for column in ("id", "note", "label", "defer", "expert", "class_label"):
        assert two[column].fillna("").tolist() == one[column].fillna("").tolist(), column
    for column in ("class_score", "expert_accuracy_alice", "expert_accuracy_bob"):  # other batches: float noise
        assert two[column].tolist() == pytest.approx(one[column].tolist(), abs=1e-6), column
