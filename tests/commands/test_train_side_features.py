"""`hf-defer train --side_feature_columns`: a router trained from a CSV with a categorical and a numeric side feature
reads them inside the model, saves them in its config, and `hf-defer predict`, the run's own predictions.csv and the
pipeline agree on the same rows; the data's mistakes are named by column and row before any model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import pipeline

from hf_defer.commands.arguments import parse_run_arguments
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

WORDS = "add two numbers prove theorem name capital city translate word".split()
COMMON = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
          "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--learning_rate", "3e-2",
          "--pooling", "mean"]


def _frame(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Prompts drawn alike for both subjects (the text says nothing): the weak model is right on history only, the
    strong one everywhere; `length` is noise."""
    subjects = rng.choice(["math", "history"], size=n)
    return pd.DataFrame({"prompt": [" ".join(rng.choice(WORDS, size=3)) for _ in range(n)], "subject": subjects,
                         "length": rng.integers(5, 400, size=n), "weak": subjects == "history",
                         "strong": np.ones(n, dtype=bool)})


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("side_features")
    save_tiny_bert(root / "encoder", WORDS)
    rng = np.random.default_rng(0)
    _frame(rng, 64).to_csv(root / "train.csv", index=False)
    _frame(rng, 16).to_csv(root / "dev.csv", index=False)
    _frame(rng, 12)[["prompt", "subject", "length"]].to_csv(root / "test.csv", index=False)  # no correctness known
    return root


def _train(project: Path, out: Path, *extra: str, train: str = "train.csv", test: str = "test.csv") -> int:
    return hf_defer_main(["train", "--model_name_or_path", str(project / "encoder"),
                          "--train_file", str(project / train), "--validation_file", str(project / "dev.csv"),
                          "--test_file", str(project / test), "--text_column_names", "prompt", "--route_only",
                          "--expert_correct_columns", "weak,strong", "--side_feature_columns", "subject,length",
                          "--side_feature_dim", "4", "--num_train_epochs", "6", "--output_dir", str(out),
                          *COMMON, *extra])


def test_train_with_side_features_then_predict_agrees_with_the_pipeline(project, capsys):
    out = project / "router"
    assert _train(project, out) == 0
    config = json.loads((out / "config.json").read_text())
    train = pd.read_csv(project / "train.csv")
    subject, length = config["side_features"]
    assert subject == {"name": "subject", "kind": "categorical", "categories": ["history", "math"], "dim": 4}
    # the training split's mean and (population) standard deviation, computed here by numpy
    assert length["name"] == "length" and length["kind"] == "numeric"
    assert length["mean"] == pytest.approx(train["length"].mean())
    assert length["std"] == pytest.approx(train["length"].std(ddof=0))

    test = pd.read_csv(project / "test.csv")
    router = pipeline("deferral", model=str(out))
    # the model card names the side features, and its usage example (a category, the mean) runs as written
    card = (out / "README.md").read_text()
    assert "with the side feature(s) `subject`, `length`" in card
    example = next(line for line in card.splitlines() if line.startswith("deferral({"))[len("deferral("):-1]
    assert example == '{"text": "An example input.", "subject": "history", "length": %.4g}' % length["mean"]
    assert router(json.loads(example))["expert"] in ("weak", "strong")
    expected = router([{"text": p, "subject": s, "length": int(n)} for p, s, n in test.itertuples(index=False)])
    assert hf_defer_main(["predict", "--model", str(out), "--input", str(project / "test.csv"), "--text_column_names",
                          "prompt", "--output", str(project / "decisions.csv")]) == 0
    for saved in (pd.read_csv(project / "decisions.csv"), pd.read_csv(out / "predictions.csv")):
        assert saved["expert"].tolist() == [o["expert"] for o in expected]
        for name in ("weak", "strong"):
            assert saved[f"expert_accuracy_{name}"].tolist() == \
                [pytest.approx(o["expert_scores"][name], abs=1e-5) for o in expected]
    # The text carries nothing, so what the router learned of the weak model comes through the subject alone.
    weak = np.array([o["expert_scores"]["weak"] for o in expected])
    is_math = (test["subject"] == "math").to_numpy()
    assert 0 < is_math.sum() < len(is_math)
    assert weak[is_math].max() < weak[~is_math].min()

    # hf-defer evaluate reads the same columns through the model's config
    capsys.readouterr()
    assert hf_defer_main(["evaluate", "--model", str(out), "--input", str(project / "dev.csv"),
                          "--text_column_names", "prompt", "--expert_correct_columns", "weak,strong"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0 <= metrics["system_error"] <= 1

    # hf-defer calibrate too: at most a quarter of the validation rows go to the strong model, by the pipeline's
    # margins on the rows with their side features
    dev = pd.read_csv(project / "dev.csv")
    assert hf_defer_main(["calibrate", "--model", str(out), "--input", str(project / "dev.csv"), "--text_column_names",
                          "prompt", "--max_deferral_rate", "0.25", "--output_dir", str(project / "calibrated")]) == 0
    threshold = json.loads(capsys.readouterr().out)["defer_threshold"]
    margins = np.array([o["margin"] for o in router([{"text": p, "subject": s, "length": int(n)} for p, s, n in
                                                      dev[["prompt", "subject", "length"]].itertuples(index=False)],
                                                     return_margin=True)])
    assert 3 / 16 <= (margins > threshold).mean() <= 4 / 16

    # a file without a side feature, or with a word where the model reads a number, is refused naming it
    test.drop(columns=["subject"]).to_csv(project / "no_subject.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(out), "--input", str(project / "no_subject.csv"),
                          "--text_column_names", "prompt", "--output", str(project / "x.csv")]) == 2
    assert "lacks the column(s) ['subject']" in capsys.readouterr().err
    for row, cell, message in ((5, "long", "the model reads 'length' as a number, got 'long'"),
                               (7, None, "the value is missing")):
        bad = test.astype({"length": object})
        bad.loc[row, "length"] = cell
        bad.to_csv(project / "bad_test.csv", index=False)
        assert hf_defer_main(["predict", "--model", str(out), "--input", str(project / "bad_test.csv"),
                              "--text_column_names", "prompt", "--output", str(project / "x.csv")]) == 2
        assert f"side feature column 'length', row {row}: {message}" in capsys.readouterr().err
    dev = dev.astype({"length": object})
    dev.loc[3, "length"] = "long"
    dev.to_csv(project / "bad_dev.csv", index=False)
    assert hf_defer_main(["evaluate", "--model", str(out), "--input", str(project / "bad_dev.csv"),
                          "--text_column_names", "prompt", "--expert_correct_columns", "weak,strong"]) == 2
    assert "side feature column 'length', row 3: the model reads 'length' as a number, got 'long'" in \
        capsys.readouterr().err
    assert hf_defer_main(["calibrate", "--model", str(out), "--input", str(project / "bad_dev.csv"),
                          "--text_column_names", "prompt", "--max_deferral_rate", "0.25", "--output_dir",
                          str(project / "calibrated2")]) == 2
    assert "side feature column 'length' of --input" in capsys.readouterr().err


@pytest.mark.slow  # about 15 s on a shared CPU: 30 epochs
def test_a_frozen_encoder_router_keeps_its_trained_side_features(project, tmp_path):
    # --freeze_encoder trains a head (and the side features' embeddings) on cached sentence embeddings, then puts
    # them on the encoder: the saved text model must carry the trained embeddings, or the subject would be noise
    out = tmp_path / "frozen"
    assert _train(project, out, "--freeze_encoder", "--embedding_cache_dir", str(tmp_path / "cache"),
                  "--num_train_epochs", "30") == 0
    test = pd.read_csv(project / "test.csv")
    router = pipeline("deferral", model=str(out))
    weak = np.array([o["expert_scores"]["weak"] for o in router(
        [{"text": p, "subject": s, "length": int(n)} for p, s, n in test.itertuples(index=False)])])
    is_math = (test["subject"] == "math").to_numpy()
    assert weak[is_math].max() < weak[~is_math].min()
    assert pd.read_csv(out / "predictions.csv")["expert_accuracy_weak"].tolist() == \
        [pytest.approx(value, abs=1e-5) for value in weak]


@pytest.mark.parametrize("change, message", [
    (lambda f: f.drop(columns=["length"]), "--side_feature_columns ['length'] not among the columns of split 'train'"),
    (lambda f: f.assign(length=f["length"].astype(float).where(f.index != 5)),
     "side feature column 'length' of split 'train', row 5: the value is missing"),
    (lambda f: f.assign(length=f["length"].astype(object).where(f.index != 7, "lots")),
     "side feature column 'length' of split 'train' holds mostly numbers but row 7 holds 'lots'"),
])
def test_bad_side_feature_columns_are_named_before_training(project, tmp_path, capsys, change, message):
    change(pd.read_csv(project / "train.csv")).to_csv(tmp_path / "bad.csv", index=False)
    capsys.readouterr()
    assert _train(project, tmp_path / "out", train=str(tmp_path / "bad.csv")) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "out" / "config.json").exists()


def test_an_unlabelled_test_file_with_a_word_in_a_numeric_side_feature_is_named(project, tmp_path, capsys):
    test = pd.read_csv(project / "test.csv").astype({"length": object})
    test.loc[2, "length"] = "short"
    test.to_csv(tmp_path / "test.csv", index=False)
    capsys.readouterr()
    assert _train(project, tmp_path / "out", test=str(tmp_path / "test.csv")) == 2
    assert "side feature column 'length' of split 'test'" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--categorical_side_feature_columns", "tier"], "--categorical_side_feature_columns ['tier'] must be among"),
    (["--side_feature_columns", "subject,weak"], "--side_feature_columns ['weak'] are also the label, an expert"),
    (["--side_feature_columns", "subject,subject"], "names a column twice"),
    (["--side_feature_dim", "0"], "--side_feature_dim must be a positive integer"),
])
def test_side_feature_flags_are_checked_by_the_parse(tmp_path, extra, message):
    argv = ["--model_name_or_path", "m", "--train_file", str(tmp_path / "t.csv"), "--output_dir", str(tmp_path / "o"),
            "--route_only", "--expert_correct_columns", "weak,strong", "--side_feature_columns", "subject", *extra]
    (tmp_path / "t.csv").write_text("prompt\n")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_run_arguments(argv)


def test_help_all_lists_the_side_feature_flags(capsys):
    assert hf_defer_main(["train", "--help-all"]) == 0
    shown = capsys.readouterr().out
    for flag in ("--side_feature_columns", "--categorical_side_feature_columns", "--side_feature_dim"):
        assert flag in shown
