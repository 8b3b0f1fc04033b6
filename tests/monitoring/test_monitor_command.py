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
