"""scripts/score_with_ray.py scores a table through Ray Data (`map_batches` over pipeline actors, on a local Ray
instance) and writes, row for row, the decisions of `hf-defer predict` on the same file: a tiny random text model
(word-level tokenizer, one-layer BERT) and a head-only model over feature vectors, each against `predict_file`."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tiny_bert import save_tiny_bert
from transformers import BertTokenizer
from hf_defer import DeferralConfig, EncoderForDeferral, save_for_hub
from hf_defer.commands.predict import predict_file

ray = pytest.importorskip("ray", reason="the scale extra (ray[data]) is not installed")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "score_with_ray.py"
WORDS = ["good", "bad", "fine", "awful", "nice", "meh", "great", "poor"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _compare(scored: pd.DataFrame, expected: pd.DataFrame, id_column: str) -> None:
    scored = scored.sort_values(id_column).reset_index(drop=True)
    expected = expected.sort_values(id_column).reset_index(drop=True)
    assert list(scored.columns) == list(expected.columns)
    assert list(scored[id_column]) == list(expected[id_column])
    for column in expected.columns:
        if expected[column].dtype.kind == "f":
            np.testing.assert_allclose(scored[column].to_numpy(float), expected[column].to_numpy(float), atol=1e-6,
                                       err_msg=column)
        else:
            assert [None if pd.isna(v) else v for v in scored[column]] == \
                   [None if pd.isna(v) else v for v in expected[column]], column


@pytest.mark.slow
def test_ray_scores_equal_predict_for_a_text_and_a_feature_model(local_ray, tmp_path, capsys):
    score = runpy.run_path(str(SCRIPT))["main"]
    rng = np.random.default_rng(0)
    # a text model: tiny BERT under a deferral head with two experts
    encoder = save_tiny_bert(tmp_path / "bert", WORDS)
    torch.manual_seed(0)
    model = EncoderForDeferral.from_encoder_pretrained(str(encoder), num_labels=3, num_experts=2,
                                                       expert_names=["a", "b"], id2label={0: "neg", 1: "neu", 2: "pos"},
                                                       pooling="mean")
    with torch.no_grad():
        model.head[-1].weight.mul_(20)  # decisions that differ between rows: some deferred, some not
    text_model = tmp_path / "text-model"
    save_for_hub(model, text_model, processing_class=BertTokenizer.from_pretrained(encoder))
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 6))) for _ in range(40)]
    table = tmp_path / "texts.parquet"
    pd.DataFrame({"id": [f"t{i:02d}" for i in range(40)], "text": texts}).to_parquet(table)
    predict_file(str(text_model), str(table), str(tmp_path / "text.parquet"), batch_size=8,
                 text_column_names=["text"], disable_progress_bar=True)
    assert score(["--model", str(text_model), "--input", str(table), "--output", str(tmp_path / "text-ray"),
                  "--text_column_names", "text", "--batch_size", "8", "--concurrency", "2", "--cpus_per_actor", "0.5"]) == 0
    _compare(pd.read_parquet(tmp_path / "text-ray"), pd.read_parquet(tmp_path / "text.parquet"), "id")

    # a head-only model over 4 features, from a CSV (the vectors as JSON lists, as hf-defer predict reads them)
    torch.manual_seed(1)
    features_model = tmp_path / "feature-model"
    save_for_hub(EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=1)), features_model)
    vectors = rng.normal(size=(30, 4)) * 3
    frame = pd.DataFrame({"key": np.arange(100, 130), "features": list(vectors), "note": [f"n{i}" for i in range(30)]})
    vectors_table = tmp_path / "vectors.parquet"
    frame.to_parquet(vectors_table)
    predict_file(str(features_model), str(vectors_table), str(tmp_path / "vec.parquet"), batch_size=4,
                 id_column_name="key", copy_columns=["note"], disable_progress_bar=True)
    assert score(["--model", str(features_model), "--input", str(vectors_table), "--output",
                  str(tmp_path / "vec-ray"), "--id_column_name", "key", "--features_column_name", "features",
                  "--copy_columns", "note", "--batch_size", "4", "--preserve_order"]) == 0
    scored = pd.read_parquet(tmp_path / "vec-ray")
    _compare(scored, pd.read_parquet(tmp_path / "vec.parquet"), "key")
    capsys.readouterr()
    assert score(["--model", str(features_model), "--input", str(vectors_table), "--output", str(tmp_path / "vec-ray"),
                  "--id_column_name", "key", "--features_column_name", "features"]) == 2  # one line, exit status 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("score_with_ray.py: error: --output ") and "vec-ray' exists" in last, last


def test_a_missing_input_or_a_bad_model_folder_is_named_before_ray_starts(tmp_path, capsys, monkeypatch):
    """Each mistake is one line naming the flag and the file or folder, exit status 2, and Ray never starts."""
    main = runpy.run_path(str(SCRIPT))["main"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started before the arguments were checked"))
    config = DeferralConfig(feature_size=2, num_labels=2, num_experts=1, expert_names=["a"])
    save_for_hub(EncoderForDeferral(config), tmp_path / "model")
    pd.DataFrame({"id": [1, 2], "features": [[0.0, 1.0], [1.0, 0.0]]}).to_parquet(tmp_path / "in.parquet")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "latin.csv").write_bytes(b"id,text\n1,caf\xe9\n")
    (tmp_path / "taken").mkdir()
    good = ["--model", str(tmp_path / "model"), "--input", str(tmp_path / "in.parquet"), "--features_column_name",
            "features", "--output", str(tmp_path / "out")]

    def refused(changes: dict[str, str], *expected: str) -> None:
        argv = list(good)
        for flag, value in changes.items():
            argv[argv.index(flag) + 1] = value
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err, err
        for words in expected:
            assert words in err, err

    refused({"--input": str(tmp_path / "nope.parquet")}, "--input", "nope.parquet' does not exist")
    refused({"--input": str(tmp_path / "notes.txt")}, "--input must be a .parquet or .csv file")
    refused({"--input": str(tmp_path / "latin.csv")}, "--input", "latin.csv', line 2: not UTF-8 text")
    refused({"--features_column_name": "vectors"}, "['vectors'] are not columns of --input")
    refused({"--output": str(tmp_path / "taken")}, "--output", "taken' exists")
    refused({"--model": str(tmp_path / "nope")}, "--model", "nope")
    refused({"--model": str(tmp_path / "empty")}, "--model", "empty' is not a model that can be loaded")
    refused({"--model": str(tmp_path / "bert")}, "--model", "bert' holds a 'bert' model, not a deferral model")
    assert not (tmp_path / "out").exists()
