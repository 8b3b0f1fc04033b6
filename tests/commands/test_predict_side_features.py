"""`hf-defer predict` with a model that has side features: they are read from the input's columns named as them (the
pipeline on dict inputs, itself checked against the forward pass in tests/modeling/test_side_features.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from transformers import BertTokenizer, pipeline

from hf_defer import DeferralConfig, EncoderForDeferral, EncoderForRouting
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

WORDS = "prove the theorem name a city add two numbers".split()
SPECS = [{"name": "tier", "kind": "categorical", "categories": ["free", "pro"], "dim": 2},
         {"name": "length", "kind": "numeric", "mean": 50.0, "std": 20.0}]


def test_predict_reads_the_side_features_from_their_columns(tmp_path, capsys):
    save_tiny_bert(tmp_path / "enc", WORDS)
    torch.manual_seed(4)
    model = EncoderForDeferral.from_encoder_pretrained(str(tmp_path / "enc"), route_only=True, num_experts=2,
                                                       expert_names=["weak", "strong"], pooling="mean",
                                                       side_features=SPECS)
    model.save_pretrained(tmp_path / "router")
    BertTokenizer.from_pretrained(tmp_path / "enc").save_pretrained(tmp_path / "router")
    frame = pd.DataFrame({"prompt": ["prove the theorem", "name a city", "add two numbers", "name a city"],
                          "tier": ["free", "pro", "team", "free"], "length": [10, 90, 40.5, 70]})
    frame.to_csv(tmp_path / "in.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(tmp_path / "router"), "--input", str(tmp_path / "in.csv"),
                          "--text_column_names", "prompt", "--output", str(tmp_path / "out.csv")]) == 0
    got = pd.read_csv(tmp_path / "out.csv")
    router = pipeline("deferral", model=str(tmp_path / "router"))
    expected = router([{"text": p, "tier": t, "length": n} for p, t, n in frame.itertuples(index=False)])
    assert got["expert"].tolist() == [out["expert"] for out in expected]
    for name in ("weak", "strong"):
        assert got[f"expert_accuracy_{name}"].tolist() == \
            [pytest.approx(out["expert_scores"][name], abs=1e-6) for out in expected]
    frame.drop(columns=["length"]).to_csv(tmp_path / "short.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(tmp_path / "router"), "--input", str(tmp_path / "short.csv"),
                          "--text_column_names", "prompt", "--output", str(tmp_path / "out2.csv")]) == 2
    assert "lacks the column(s) ['length']" in capsys.readouterr().err


def test_a_head_only_router_reads_its_feature_vectors_and_side_features(tmp_path):
    torch.manual_seed(5)
    config = DeferralConfig(feature_size=3, route_only=True, num_experts=2, expert_names=["weak", "strong"],
                            side_features=SPECS)
    EncoderForRouting(config).save_pretrained(tmp_path / "router")
    vectors = [[0.5, -1.0, 2.0], [1.5, 0.0, -0.5], [-2.0, 1.0, 0.25]]
    frame = pd.DataFrame({"features": [json.dumps(v) for v in vectors], "tier": ["pro", "free", "team"],
                          "length": [30, 80.5, 55]})
    frame.to_csv(tmp_path / "in.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(tmp_path / "router"), "--input", str(tmp_path / "in.csv"),
                          "--features_column_name", "features", "--output", str(tmp_path / "out.csv")]) == 0
    got = pd.read_csv(tmp_path / "out.csv")
    router = pipeline("deferral", model=str(tmp_path / "router"))
    expected = router([{"features": v, "tier": t, "length": n}
                       for v, t, n in zip(vectors, frame["tier"], frame["length"])])
    assert got["expert"].tolist() == [out["expert"] for out in expected]
    for name in ("weak", "strong"):
        assert got[f"expert_accuracy_{name}"].tolist() == \
            [pytest.approx(out["expert_scores"][name], abs=1e-6) for out in expected]


def test_a_category_learnt_from_integers_is_matched_in_every_format(tmp_path, capsys):
    """A tier learnt from the integers 1, 2, 3 (categories "1", "2", "3") is the same tier read back as text from a CSV,
    as integers from JSON Lines and as float64 1.0 from Parquet: the decisions of the rows as trained, never the
    "unseen" row (which the test checks would give other scores)."""
    from hf_defer.modeling.side_features import side_feature_specs

    specs = side_feature_specs({"tier": [1, 2, 3, 2]}, dim=2, categorical=["tier"])
    assert specs[0]["categories"] == ["1", "2", "3"]
    torch.manual_seed(6)
    config = DeferralConfig(feature_size=3, route_only=True, num_experts=2, expert_names=["weak", "strong"],
                            side_features=specs)
    EncoderForRouting(config).save_pretrained(tmp_path / "router")
    vectors = [[0.5, -1.0, 2.0], [1.5, 0.0, -0.5], [-2.0, 1.0, 0.25]]
    router = pipeline("deferral", model=str(tmp_path / "router"))
    trained = router([{"features": v, "tier": t} for v, t in zip(vectors, ["1", "2", "3"])])
    unseen = router([{"features": v, "tier": "9"} for v in vectors])
    assert [o["expert_scores"] for o in trained] != [o["expert_scores"] for o in unseen]  # the tier matters
    frame = pd.DataFrame({"features": vectors, "tier": [1.0, 2.0, 3.0]})
    frame.to_parquet(tmp_path / "in.parquet")
    frame.assign(tier=[1, 2, 3]).to_json(tmp_path / "in.jsonl", orient="records", lines=True)
    frame.assign(features=[json.dumps(v) for v in vectors], tier=["1", "2", " 3"]).to_csv(tmp_path / "in.csv",
                                                                                         index=False)
    assert pd.read_parquet(tmp_path / "in.parquet")["tier"].dtype == "float64"
    for name in ("in.parquet", "in.jsonl", "in.csv"):
        out = tmp_path / f"{name}.out.csv"
        assert hf_defer_main(["predict", "--model", str(tmp_path / "router"), "--input", str(tmp_path / name),
                              "--output", str(out)]) == 0
        got = pd.read_csv(out)
        for expert in ("weak", "strong"):
            assert got[f"expert_accuracy_{expert}"].tolist() == \
                [pytest.approx(o["expert_scores"][expert], abs=1e-6) for o in trained], name
    # a list where one value belongs is named (file, column, row), not turned into its string
    pd.DataFrame({"features": vectors, "tier": [[1], [2], [3]]}).to_json(tmp_path / "lists.jsonl", orient="records",
                                                                         lines=True)
    (tmp_path / "dicts.jsonl").write_text("".join(json.dumps({"features": v, "tier": t}) + "\n" for v, t in
                                                  zip(vectors, [1, {"tier": 2}, 3])))
    for name, row, kind in (("lists.jsonl", 0, "list"), ("dicts.jsonl", 1, "dict")):
        capsys.readouterr()
        assert hf_defer_main(["predict", "--model", str(tmp_path / "router"), "--input", str(tmp_path / name),
                              "--output", str(tmp_path / f"{name}.csv")]) == 2
        err = capsys.readouterr().err
        if name == "dicts.jsonl" and "cannot be read as jsonl" in err:
            # older datasets/pyarrow (make test-oldest) refuse a column of numbers and objects while reading: still
            # one line naming the file and the column, never a value routed on its string
            assert str(tmp_path / name) in err and "tier" in err and len(err.strip().splitlines()) == 1, err
            continue
        assert f"side feature column 'tier', row {row}: expected one value" in err and f"got a {kind}" in err, err
