"""`hf-defer calibrate`: a saved text model calibrated on a labelled CSV gets the certified threshold of its own
pipeline's margins, the guarantee in its config.json, and the user's folder is replaced only with --overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import BertTokenizer

from hf_defer import DeferralConfig, EncoderForDeferral, calibrate_deferral
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

WORDS = "good bad great awful fine movie plot actor boring fun".split()
CLASSES = ["negative", "positive"]
N = 300


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("calibrate")
    save_tiny_bert(root / "encoder", WORDS)
    model = EncoderForDeferral.from_encoder_pretrained(str(root / "encoder"), num_labels=2, num_experts=2,
                                                       expert_names=["alice", "bob"], pooling="mean",
                                                       id2label=dict(enumerate(CLASSES)))
    model.head[-1].bias.data[2:] += 0.3  # experts look good: some inputs defer
    model.save_pretrained(root / "model")
    BertTokenizer.from_pretrained(root / "encoder").save_pretrained(root / "model")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, N)
    pd.DataFrame({"review": [" ".join(rng.choice(WORDS, size=rng.integers(2, 6))) for _ in range(N)],
                  "label": [CLASSES[v] for v in y],
                  "alice": [CLASSES[v if rng.random() < 0.9 else 1 - v] for v in y],
                  "bob": [CLASSES[v if rng.random() < 0.7 else 1 - v] if rng.random() > 0.1 else None for v in y],
                  }).to_csv(root / "cal.csv", index=False)
    return root / "model", root / "cal.csv"


def test_calibrate_budget_matches_the_library_and_saves(saved, tmp_path, capsys):
    model, table = saved
    argv = ["calibrate", "--model", str(model), "--input", str(table), "--text_column_name", "review",
            "--max_deferral_rate", "0.2", "--confidence", "0.9"]
    assert hf_defer_main(argv) == 2  # the model folder would change: --overwrite or --output_dir
    assert "pass --overwrite" in capsys.readouterr().err
    assert hf_defer_main([*argv, "--output_dir", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    expected = EncoderForDeferral.from_pretrained(model)
    texts = pd.read_csv(table)["review"].tolist()
    tokenizer = BertTokenizer.from_pretrained(model)
    threshold = calibrate_deferral(expected, texts, max_deferral_rate=0.2, confidence=0.9, tokenizer=tokenizer,
                                   truncation=True, max_length=32)
    assert summary["defer_threshold"] == pytest.approx(threshold, abs=1e-6)
    assert summary["statement"].startswith("On new inputs, at most 20 % of the inputs go to an expert")
    saved_config = DeferralConfig.from_pretrained(tmp_path / "out")
    assert saved_config.deferral_guarantee["n"] == N and saved_config.defer_threshold == summary["defer_threshold"]
    assert DeferralConfig.from_pretrained(model).deferral_guarantee is None  # the user's folder is untouched


def test_calibrate_error_target_in_place(saved, tmp_path, capsys):
    model, table = saved
    import shutil

    shutil.copytree(model, tmp_path / "model")
    argv = ["calibrate", "--model", str(tmp_path / "model"), "--input", str(table), "--text_column_name", "review",
            "--max_error", "0.01", "--confidence", "0.9", "--missing_expert", "mask", "--overwrite"]
    assert hf_defer_main(argv) == 2
    assert "smallest max_error certified here is" in capsys.readouterr().err
    argv[argv.index("0.01")] = "0.3"
    assert hf_defer_main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    claim = DeferralConfig.from_pretrained(tmp_path / "model").deferral_guarantee["claims"][0]
    assert claim["kind"] == "system_error" and claim["target"] == 0.3 and claim["observed"] <= 0.3
    assert summary["deferral_guarantee"]["n"] == N  # --missing_expert mask keeps every row


def test_train_certifies_on_the_validation_split(saved, tmp_path, capsys):
    _, table = saved
    encoder = table.parent / "encoder"
    frame = pd.read_csv(table)
    frame.iloc[:100].to_csv(tmp_path / "train.csv", index=False)
    frame.iloc[100:].to_csv(tmp_path / "dev.csv", index=False)
    argv = ["train", "--model_name_or_path", str(encoder), "--train_file", str(tmp_path / "train.csv"),
            "--validation_file", str(tmp_path / "dev.csv"), "--text_column_name", "review", "--label_column_name",
            "label", "--expert_column_names", "alice,bob", "--missing_expert", "mask", "--max_seq_length", "8",
            "--do_train", "--num_train_epochs", "1", "--output_dir", str(tmp_path / "out"), "--report_to", "none",
            "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--per_device_train_batch_size", "16",
            "--max_error", "0.6", "--confidence", "0.9", "--json"]
    assert hf_defer_main(argv) == 0
    guarantee = DeferralConfig.from_pretrained(tmp_path / "out").deferral_guarantee
    assert guarantee["n"] == N - 100 and guarantee["claims"][0]["kind"] == "system_error"
    assert guarantee["claims"][0]["target"] == 0.6 and guarantee["claims"][0]["observed"] <= 0.6
    assert "### What is guaranteed" in (tmp_path / "out" / "README.md").read_text()


def test_calibrate_rewrites_the_card_of_the_folder_it_writes(saved, tmp_path, capsys):
    # Issue 41: after `calibrate --overwrite` the card still said the former threshold and had no guarantee, and an
    # --output_dir copy had no card at all. The card in a folder describes the config in that folder.
    import shutil

    from huggingface_hub import ModelCard

    from hf_defer.hub import DeferralModelCardData, render_model_card

    model, table = saved
    shutil.copytree(model, tmp_path / "model")
    stale = DeferralModelCardData.from_model(EncoderForDeferral.from_pretrained(model), license="mit",
                                             metrics={"coverage": 0.123456, "system_error": 0.2})
    render_model_card(stale, tmp_path / "model")
    argv = ["calibrate", "--model", str(tmp_path / "model"), "--input", str(table), "--text_column_name", "review",
            "--max_deferral_rate", "0.2", "--confidence", "0.9"]
    assert hf_defer_main([*argv, "--overwrite"]) == 0
    captured = capsys.readouterr()
    config = DeferralConfig.from_pretrained(tmp_path / "model")
    card = (tmp_path / "model" / "README.md").read_text()
    assert f"**Deferral threshold:** {config.defer_threshold:.4g} (certified" in card
    assert "### What is guaranteed" in card and json.loads(captured.out)["statement"].split(".")[0] in card
    assert "0.1235" not in card  # the former metrics were measured at another threshold: gone
    assert ModelCard.load(tmp_path / "model" / "README.md").data.license == "mit"  # the card's own metadata kept
    assert f"the calibrated model is in {(tmp_path / 'model').resolve()}" in captured.err
    # a copy gets the card of its own config, and the source folder keeps its own
    assert hf_defer_main([*argv, "--max_deferral_rate", "0.3", "--output_dir", str(tmp_path / "copy")]) == 0
    copy = DeferralConfig.from_pretrained(tmp_path / "copy")
    assert f"**Deferral threshold:** {copy.defer_threshold:.4g}" in (tmp_path / "copy" / "README.md").read_text()
    assert str((tmp_path / "copy").resolve()) in capsys.readouterr().err
    # a README that hf_defer did not write is the user's: left as it is, and stderr says so
    (tmp_path / "model" / "README.md").write_text("# my own notes\n")
    assert hf_defer_main([*argv, "--overwrite"]) == 0
    assert (tmp_path / "model" / "README.md").read_text() == "# my own notes\n"
    assert "not written by hf_defer, was left as it is" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["alice=0.1,alice=0.5", "alice=0.1, alice =0.1"])
def test_a_budget_given_twice_for_one_expert_is_an_error(value):
    """Issue 42: `alice=0.1,alice=0.5` kept 0.5 and dropped the stricter 0.1; a repeated name is refused, named."""
    from hf_defer.commands.calibrate import parse_rates

    with pytest.raises(ValueError, match=r"--max_deferral_rate names 'alice' more than once"):
        parse_rates(value, ["alice", "bob"])
    assert parse_rates("alice=0.1,bob=0.5", ["alice", "bob"]) == {"alice": 0.1, "bob": 0.5}


def test_an_expert_column_given_twice_is_an_error():
    from hf_defer.commands.evaluate import match_expert_columns

    with pytest.raises(ValueError, match="named more than once"):
        match_expert_columns(["alice=a", "alice=b", "bob=c"], ["alice", "bob"])


def test_calibrate_with_unlabeled_file_is_prediction_powered(saved, tmp_path, capsys):
    """Issue 47: --unlabeled_file runs the prediction-powered test; the record names the method and the number of
    unlabelled inputs, and the threshold is the library's on the same inputs."""
    model, table = saved
    labelled = pd.read_csv(table)
    labelled["bob"] = labelled["bob"].fillna(labelled["label"])  # the unlabelled test needs every expert's answer
    labelled.to_csv(tmp_path / "cal.csv", index=False)
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(2, 6))) for _ in range(500)]
    pd.DataFrame({"review": texts}).to_csv(tmp_path / "unlabeled.csv", index=False)
    argv = ["calibrate", "--model", str(model), "--input", str(tmp_path / "cal.csv"), "--text_column_name", "review",
            "--max_error", "0.3", "--confidence", "0.9", "--unlabeled_file", str(tmp_path / "unlabeled.csv"),
            "--output_dir", str(tmp_path / "out")]
    assert hf_defer_main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    claim = summary["deferral_guarantee"]["claims"][0]
    assert claim["method"] == "prediction_powered" and claim["unlabeled"] == 500
    assert "prediction-powered" in claim["bound"] and "prediction-powered" in summary["statement"]
    expected = EncoderForDeferral.from_pretrained(model)
    threshold = calibrate_deferral(expected, labelled["review"].tolist(), max_error=0.3, confidence=0.9,
                                   labels=labelled["label"].map(CLASSES.index).to_numpy(),
                                   expert_labels=np.stack([labelled[name].map(CLASSES.index) for name in
                                                           ("alice", "bob")], axis=1),
                                   unlabeled=texts, tokenizer=BertTokenizer.from_pretrained(model), truncation=True,
                                   max_length=32)
    assert summary["defer_threshold"] == pytest.approx(threshold, abs=1e-6)
    argv[argv.index(str(tmp_path / "cal.csv"))] = str(table)  # bob did not answer some rows: who would, unlabelled?
    assert hf_defer_main([*argv[:-1], str(tmp_path / "out2"), "--missing_expert", "mask"]) == 2
    assert "every expert to have answered every labelled row" in capsys.readouterr().err


def test_calibrate_expected_error(saved, tmp_path, capsys):
    """Issue 47: --guarantee expected promises the error on average over calibration draws: the library's threshold,
    recorded with no confidence, the statement and the card say so; flags that make no sense with it are refused."""
    model, table = saved
    argv = ["calibrate", "--model", str(model), "--input", str(table), "--text_column_name", "review",
            "--max_error", "0.4", "--guarantee", "expected", "--missing_expert", "mask",
            "--output_dir", str(tmp_path / "out")]
    assert hf_defer_main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    claim = summary["deferral_guarantee"]["claims"][0]
    assert summary["deferral_guarantee"]["confidence"] is None and claim["method"] == "conformal_risk_control"
    assert summary["statement"].startswith("**In expectation only.**")
    assert "In expectation only" in (tmp_path / "out" / "README.md").read_text()
    labelled = pd.read_csv(table)
    threshold = calibrate_deferral(EncoderForDeferral.from_pretrained(model), labelled["review"].tolist(),
                                   max_error=0.4, guarantee="expected",
                                   labels=labelled["label"].map(CLASSES.index).to_numpy(),
                                   expert_labels=np.stack([labelled[name].map({c: k for k, c in enumerate(CLASSES)}).fillna(-100).astype(int)
                                                           for name in ("alice", "bob")], axis=1),
                                   tokenizer=BertTokenizer.from_pretrained(model), truncation=True, max_length=32)
    assert summary["defer_threshold"] == pytest.approx(threshold, abs=1e-6)
    for extra, flag in ((["--confidence", "0.9"], "--confidence"), (["--max_deferral_rate", "0.1"],
                                                                     "--max_deferral_rate"), (["--selective"],
                                                                                              "--selective")):
        assert hf_defer_main([*argv[:-1], str(tmp_path / "out2"), *extra]) == 2
        error = capsys.readouterr().err
        assert "--guarantee expected promises --max_error alone" in error and flag in error
        assert len(error.strip().splitlines()) == 1
    assert hf_defer_main([*argv[:-1], str(tmp_path / "out3"), "--guarantee", "sometimes"]) == 2
    assert "must be one of high_probability, expected, got 'sometimes'" in capsys.readouterr().err
