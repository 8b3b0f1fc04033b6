"""`hf-defer monitor` on a small decision log written as `hf-defer predict` writes it, with a labels file as
`hf-defer review pull` writes it."""

import csv
import json

import numpy as np
import pytest

import hf_defer
from hf_defer.commands import main
from hf_defer.commands.outputs import write_predictions


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("monitor")
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2, num_experts=2,
                                                                expert_names=["alice", "bob"]))
    rng = np.random.default_rng(0)
    hf_defer.calibrate_deferral(model, list(rng.normal(size=(300, 4)).astype("float32")), max_deferral_rate=0.3,
                                confidence=0.9)
    model.save_pretrained(folder / "model")
    outputs = hf_defer.DeferralPipeline(model=model)(list(rng.normal(size=(60, 4)).astype("float32")))
    write_predictions(outputs, folder / "decisions.jsonl", ["alice", "bob"], ids=[f"q{i}" for i in range(60)],
                      id_column="id")
    return folder, outputs


def test_state_of_a_log_and_its_labels(logged, tmp_path, capsys):
    folder, outputs = logged
    deferred = [i for i, out in enumerate(outputs) if out["defer"]]
    kept = [i for i, out in enumerate(outputs) if not out["defer"]]
    assert deferred and len(kept) > 4
    audited = kept[:4]
    with open(tmp_path / "answers.csv", "w", newline="") as handle:  # hf-defer review pull's long table
        writer = csv.writer(handle)
        writer.writerow(["item", "annotator", "answer", "time"])
        for i in deferred + audited:
            right = outputs[i]["class_label"] if i != audited[0] else ("LABEL_1" if outputs[i]["class_label"] ==
                                                                       "LABEL_0" else "LABEL_0")
            writer.writerow([f"q{i}", "rev", right, "2026-01-01"])
    argv = ["monitor", "--model", str(folder / "model"), "--log", str(folder / "decisions.jsonl"), "--labels",
            str(tmp_path / "answers.csv"), "--audit_rate", "0.2", "--output", str(tmp_path / "state.json")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "60 decisions" in printed and "alarm: none" in printed
    state = json.loads((tmp_path / "state.json").read_text())
    channels = state["channels"]
    assert channels["deferral_rate"]["mean"] == pytest.approx(len(deferred) / 60)
    assert channels["deferral_rate"]["target"] == 0.3
    estimate = np.mean([1 - (out["expert_scores"][out["expert"]] if out["defer"] else out["class_score"])
                        for out in outputs])
    assert channels["estimated_error"]["mean"] == pytest.approx(estimate, abs=1e-9)
    # reviewers' answers are final on deferred rows (no error there); one audited kept row is wrong, weight 1 / 0.2
    assert channels["system_error"]["mean"] == pytest.approx(5.0 / 60)
    assert state["awaiting_labels"] == 0
    assert main(argv) == 2  # the JSON exists now
    assert "--overwrite" in capsys.readouterr().err


def test_mistakes_are_one_line(logged, tmp_path, capsys):
    folder, outputs = logged
    kept = next(i for i, out in enumerate(outputs) if not out["defer"])
    (tmp_path / "labels.csv").write_text(f"item,answer\nq{kept},LABEL_0\n")
    base = ["monitor", "--model", str(folder / "model"), "--log", str(folder / "decisions.jsonl")]
    assert main([*base, "--labels", str(tmp_path / "labels.csv")]) == 2
    assert "--audit_rate" in capsys.readouterr().err
    (tmp_path / "other.csv").write_text("item,answer\nnope,LABEL_0\n")
    assert main([*base, "--labels", str(tmp_path / "other.csv"), "--audit_rate", "0.1"]) == 2
    assert "'nope'" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("id,label\n1,x\n")
    assert main(["monitor", "--model", str(folder / "model"), "--log", str(tmp_path / "bad.csv")]) == 2
    assert "lacks the columns ['defer', 'expert']" in capsys.readouterr().err


def test_a_csv_log_reads_as_the_jsonl_one(logged, tmp_path):
    from hf_defer.commands.monitor import monitor_log

    folder, outputs = logged
    write_predictions(outputs, tmp_path / "decisions.csv", ["alice", "bob"])  # predict's default: CSV, ids "row"
    from_csv = monitor_log(str(folder / "model"), str(tmp_path / "decisions.csv"))
    from_jsonl = monitor_log(str(folder / "model"), str(folder / "decisions.jsonl"))
    for name in ("deferral_rate", "deferral_rate[alice]", "estimated_error"):
        assert from_csv["channels"][name]["mean"] == pytest.approx(from_jsonl["channels"][name]["mean"])
    assert from_csv["rows"] == 60


@pytest.fixture(scope="module")
def reference(logged, tmp_path_factory):
    """A reference log of 200 decisions and its labels: the classifier right exactly on the kept rows whose score is
    above the kept rows' median (a step: as miscalibrated as scores can be), the experts always right."""
    folder, _ = logged
    out = tmp_path_factory.mktemp("reference")
    model = hf_defer.EncoderForDeferral.from_pretrained(folder / "model")
    rng = np.random.default_rng(5)
    outputs = hf_defer.DeferralPipeline(model=model)(list(rng.normal(size=(200, 4)).astype("float32")))
    ids = [f"r{i}" for i in range(200)]
    write_predictions(outputs, out / "reference.jsonl", ["alice", "bob"], ids=ids, id_column="id")
    median = np.median([o["class_score"] for o in outputs if not o["defer"]])
    other = {"LABEL_0": "LABEL_1", "LABEL_1": "LABEL_0"}
    truth = []
    with open(out / "calibration.csv", "w", newline="") as handle:  # id, label, one answer column per expert
        writer = csv.writer(handle)
        writer.writerow(["id", "label", "alice", "bob"])
        for key, o in zip(ids, outputs):
            label = o["class_label"] if o["defer"] or o["class_score"] > median else other[o["class_label"]]
            truth.append(label)
            writer.writerow([key, label, label, label])
    return out, outputs, truth


def test_recalibrated_from_a_reference_log(logged, reference, tmp_path, capsys):
    folder, _ = logged
    out, outputs, truth = reference
    argv = ["monitor", "--model", str(folder / "model"), "--log", str(out / "reference.jsonl"), "--reference_log",
            str(out / "reference.jsonl"), "--reference_labels", str(out / "calibration.csv"), "--output",
            str(tmp_path / "state.json")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "recalibrated: classifier (a map fitted on" in printed
    state = json.loads((tmp_path / "state.json").read_text())
    kept = [o for o in outputs if not o["defer"]]
    recalibration = state["recalibration"]
    # the experts were always right (one outcome: no map); the classifier's step is rejected as calibrated
    assert recalibration["fitted_on_rows"] == {"classifier": len(kept)}
    assert sorted(recalibration["raw"]) == sorted({f"expert:{o['expert']}" for o in outputs if o["defer"]})
    assert recalibration["tests"]["classifier"]["p_value"] < 1e-6
    assert state["reference_log"] == str(out / "reference.jsonl")
    # on the reference rows themselves the isotonic map gives back the step: error 1 at or below the median, else 0
    wrong = sum(o["class_label"] != t for o, t in zip(outputs, truth))
    expected = (wrong + sum(1 - o["expert_scores"][o["expert"]] for o in outputs if o["defer"])) / len(outputs)
    assert state["channels"]["estimated_error"]["mean"] == pytest.approx(expected)


def test_reference_flags_mistakes_are_one_line(logged, reference, tmp_path, capsys):
    folder, _ = logged
    out, outputs, truth = reference
    base = ["monitor", "--model", str(folder / "model"), "--log", str(folder / "decisions.jsonl")]
    assert main([*base, "--reference_log", str(out / "reference.jsonl")]) == 2
    assert "--reference_log and --reference_labels go together" in capsys.readouterr().err
    (tmp_path / "no_experts.csv").write_text("id,label\nr0,LABEL_0\n")
    assert main([*base, "--reference_log", str(out / "reference.jsonl"), "--reference_labels",
                 str(tmp_path / "no_experts.csv")]) == 2
    err = capsys.readouterr().err
    assert "has no column ['alice', 'bob']" in err and "--reference_expert_columns" in err
    (tmp_path / "renamed.csv").write_text("id,label,a,b\nr0,LABEL_0,LABEL_0,LABEL_0\n")
    assert main([*base, "--reference_log", str(out / "reference.jsonl"), "--reference_labels",
                 str(tmp_path / "renamed.csv"), "--reference_expert_columns", "alice=a,carol=b"]) == 2
    assert "--reference_expert_columns must name one column per expert" in capsys.readouterr().err
    (tmp_path / "unknown.csv").write_text("id,label,alice,bob\nzz,LABEL_0,LABEL_0,LABEL_0\n")
    assert main([*base, "--reference_log", str(out / "reference.jsonl"), "--reference_labels",
                 str(tmp_path / "unknown.csv")]) == 2
    assert "ids that are not in --reference_log" in capsys.readouterr().err
    (tmp_path / "twice.csv").write_text("id,label,alice,bob\nr0,LABEL_0,,\nr0,LABEL_1,,\n")
    assert main([*base, "--reference_log", str(out / "reference.jsonl"), "--reference_labels",
                 str(tmp_path / "twice.csv")]) == 2
    assert "repeat (['r0'])" in capsys.readouterr().err
    (tmp_path / "empty.csv").write_text("id,label,alice,bob\nr0,,,\n")
    assert main([*base, "--reference_log", str(out / "reference.jsonl"), "--reference_labels",
                 str(tmp_path / "empty.csv")]) == 2
    assert "no row of --reference_log" in capsys.readouterr().err
    assert main([*base, "--reference_log", str(out / "calibration.csv"), "--reference_labels",
                 str(out / "calibration.csv")]) == 2
    err = capsys.readouterr().err
    assert "--reference_log" in err and "is not a decision log" in err
    row = {"id": "r0", "defer": False, "expert": None, "class_label": "LABEL_0", "class_score": 1.5,
           "expert_accuracy_alice": 0.5, "expert_accuracy_bob": 0.5}
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "one.csv").write_text("id,label,alice,bob\nr0,LABEL_0,,\n")
    assert main([*base, "--reference_log", str(tmp_path / "bad.jsonl"), "--reference_labels",
                 str(tmp_path / "one.csv")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl' / --reference_labels" in err and "estimated probability outside [0, 1]" in err


def test_reference_rows_read_renamed_columns(logged, reference, tmp_path):
    from hf_defer.commands.monitor import reference_rows

    _, outputs, truth = reference
    out = reference[0]
    with open(tmp_path / "renamed.csv", "w", newline="") as handle:  # other column names; half the rows
        writer = csv.writer(handle)
        writer.writerow(["item", "truth", "answer_a", "answer_b"])
        for i, (o, t) in enumerate(zip(outputs, truth)):
            if i % 2 == 0:
                writer.writerow([f"r{i}", t, t if o["expert"] == "alice" else "", t if o["expert"] == "bob" else ""])
    rows, labels, answers = reference_rows(str(out / "reference.jsonl"), str(tmp_path / "renamed.csv"),
                                           ["alice", "bob"], labels_id_column="item", label_column="truth",
                                           expert_columns=["bob=answer_b", "alice=answer_a"])
    assert len(rows) == len(labels) == len(answers) == 100
    assert labels == truth[::2]
    assert answers == [t if o["defer"] else None for o, t in zip(outputs[::2], truth[::2])]
    assert [row["class_score"] for row in rows] == pytest.approx([o["class_score"] for o in outputs[::2]])


def test_an_expected_error_model_asks_for_the_alarms_confidence_by_its_flag(logged, tmp_path, capsys):
    folder, _ = logged
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2, num_experts=2,
                                                                expert_names=["alice", "bob"]))
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 200)
    hf_defer.calibrate_deferral(model, list(rng.normal(size=(200, 4)).astype("float32")), max_error=0.5,
                                guarantee="expected", labels=labels, expert_labels=np.stack([labels, labels], 1))
    model.save_pretrained(tmp_path / "model")  # experts always right: a target of 0.5 is within reach
    argv = ["monitor", "--model", str(tmp_path / "model"), "--log", str(folder / "decisions.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--confidence 0.9" in err and "confidence=" not in err  # the command's flag, not the library's keyword
    assert main([*argv, "--confidence", "0.9"]) == 0
    assert "alarm: none" in capsys.readouterr().out
