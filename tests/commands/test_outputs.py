"""What the commands write: spreadsheet-safe CSV cells, predictions.csv with the input's ids, the refusals that keep a
run or `hf-defer predict` off the user's own files."""

from __future__ import annotations

import csv
import doctest
import json
import os

import pytest

import hf_defer.commands.outputs as outputs_module
from hf_defer.commands.outputs import (
    RUN_SUMMARY,
    OutputFolder,
    check_output_file,
    format_summary,
    spreadsheet_safe,
    write_predictions,
)


@pytest.mark.parametrize(("cell", "safe"), [
    ("=1+2", "'=1+2"), ("@SUM(A1)", "'@SUM(A1)"), ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"), ("-A1", "'-A1"),
    ("\t=1", "'\t=1"), ("\r=1", "'\r=1"),  # what spreadsheets run as formulas: quoted
    ("-1.5", "-1.5"), ("+2", "+2"), ("-3e-05", "-3e-05"),  # plain numbers stay numbers
    ("neither", "neither"), ("a=b", "a=b"), ("", ""), (7, 7), (-0.25, -0.25), (None, None),
])
def test_spreadsheet_safe_quotes_what_a_spreadsheet_would_run(cell, safe):
    assert spreadsheet_safe(cell) == safe


def test_predictions_carry_the_input_ids_copied_columns_and_no_formula(tmp_path):
    outs = [{"label": "=1+2", "defer": False, "expert": None, "class_label": "=1+2", "class_score": 0.625,
             "expert_accuracy": [0.25, 0.5]},
            {"label": "defer", "defer": True, "expert": "@SUM(A1)", "class_label": "neither", "class_score": 0.5,
             "expert_accuracy": [0.75, 0.125]}]
    path = tmp_path / "p.csv"
    count = write_predictions(outs, path, ["@SUM(A1)", "bob"], ids=["a-1", "=id"], id_column="id",
                              columns={"text": ["-x", "fine"]})
    assert count == 2
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["id", "text", "label", "defer", "expert", "class_label", "class_score",
                       "expert_accuracy_@SUM(A1)", "expert_accuracy_bob"]  # starts with no formula sign
    assert rows[1] == ["a-1", "'-x", "'=1+2", "False", "", "'=1+2", "0.625", "0.25", "0.5"]
    assert rows[2] == ["'=id", "fine", "defer", "True", "'@SUM(A1)", "neither", "0.5", "0.75", "0.125"]
    write_predictions(outs, path, ["a", "b"])  # no ids: the row number
    with open(path, newline="") as handle:
        assert [row["row"] for row in csv.DictReader(handle)] == ["0", "1"]
    with pytest.raises(ValueError, match="columns must differ"):
        write_predictions(outs, path, ["a", "b"], columns={"label": ["x", "y"]})


def test_an_output_file_that_is_the_input_or_exists_is_refused(tmp_path, monkeypatch):
    data = tmp_path / "x.csv"
    data.write_text("text\nhello\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"--output 'x.csv' is the input file: .*choose another --output"):
        check_output_file("x.csv", [str(data)])
    with pytest.raises(ValueError, match="is the input file"):
        check_output_file(str(tmp_path / "sub" / ".." / "x.csv"), ["x.csv"])
    (tmp_path / "old.csv").write_text("kept")
    with pytest.raises(FileExistsError, match="--output 'old.csv' exists; pass --overwrite"):
        check_output_file("old.csv", ["x.csv"])
    check_output_file("old.csv", ["x.csv"], overwrite=True)
    check_output_file("new.csv", ["x.csv"])
    with pytest.raises(ValueError, match="is a folder"):
        check_output_file(str(tmp_path), ["x.csv"], overwrite=True)
    assert (tmp_path / "old.csv").read_text() == "kept" and data.read_text() == "text\nhello\n"


def test_output_folder_refuses_the_users_files_and_accepts_its_own(tmp_path):
    folder = tmp_path / "out"
    OutputFolder(folder).check()  # a new folder
    folder.mkdir()
    OutputFolder(folder).check()  # an empty one
    for name in ("README.md", "predictions.csv", "model-00001-of-00002.safetensors"):
        (folder / name).write_text("mine")
    with pytest.raises(FileExistsError) as refused:
        OutputFolder(folder).check()
    message = str(refused.value)
    assert "README.md, model-00001-of-00002.safetensors, predictions.csv" in message
    assert "--overwrite_output_dir" in message
    OutputFolder(folder, overwrite=True).check()  # the explicit flag

    own = tmp_path / "own"
    run = OutputFolder(own)
    run.check()
    run.start()
    (own / "checkpoint-4").mkdir()  # the Trainer's, written during the run
    (own / "model.safetensors").write_text("weights")
    (own / "all_results.json").write_text("{}")
    run.write_summary({"status": "done"})
    summary = json.loads((own / RUN_SUMMARY).read_text())
    assert summary["written_by"] == "hf_defer"
    assert summary["files"] == ["all_results.json", "checkpoint-4", "model.safetensors"]
    (own / "checkpoint-8").mkdir()  # a later checkpoint of a killed rerun: still the run's
    again = OutputFolder(own)
    again.check()  # a rerun (or a resume) into the run's own folder
    again.start()
    assert not (own / "all_results.json").exists()  # results of the last run go, so all_results.json is this run's
    (own / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="no hf_defer run or save wrote: notes.txt"):
        OutputFolder(own).check()


def test_format_summary_names_model_predictions_threshold_and_test_metrics():
    text = format_summary({"model": "/m", "predictions": "/m/predictions.csv", "predicted_rows": 3,
                           "defer_threshold": 0.125, "max_deferral_rate": 0.2, "summary_file": "/m/hf_defer_run.json",
                           "metrics": {"test": {"system_error": 0.25, "coverage": 0.5, "runtime": 1.0}}})
    assert text.splitlines() == [
        "Saved the deferral model to /m", "  predictions: /m/predictions.csv (3 rows)",
        "  deferral threshold: 0.125 (calibrated: at most 20% of the validation inputs deferred)",
        "  test metrics: system_error 0.2500, coverage 0.5000", "  summary: /m/hf_defer_run.json"]


def test_docstring_examples_run():
    result = doctest.testmod(outputs_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
    assert os.path.basename(outputs_module.__file__) == "outputs.py"
