"""Side features (`DeferralConfig(side_features=...)`): the specs from columns and the tensors from rows worked out by
hand, the head reading [pooled, embeddings, standardised numbers] checked against its own weights, the save / load
round trip, and the pipeline taking dict inputs (batched or not) with clear errors."""

from __future__ import annotations

import doctest

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import BertTokenizer, pipeline

import hf_defer.modeling.side_features as side_module
from hf_defer import DeferralConfig, EncoderForDeferral, EncoderForRouting
from hf_defer.modeling.side_features import (
    check_side_features,
    is_missing_side_value,
    side_feature_specs,
    side_feature_tensors,
    side_feature_value,
)
from tiny_bert import save_tiny_bert

SPECS = [{"name": "subject", "kind": "categorical", "categories": ["law", "math", "physics"], "dim": 2},
         {"name": "length", "kind": "numeric", "mean": 10.0, "std": 4.0}]


def test_specs_and_tensors_by_hand():
    specs = side_feature_specs({"tier": [1, 2, 2, 3], "subject": ["math", "law", "math", "law"], "n": [1, 3, 5, 7]},
                               dim=3, categorical=["tier"])
    assert specs == [{"name": "tier", "kind": "categorical", "categories": ["1", "2", "3"], "dim": 3},
                     {"name": "subject", "kind": "categorical", "categories": ["law", "math"], "dim": 3},
                     {"name": "n", "kind": "numeric", "mean": 4.0, "std": pytest.approx(5 ** 0.5)}]
    ids, numbers = side_feature_tensors(specs, [{"tier": 3, "subject": "law", "n": 2.5},
                                                {"tier": 9, "subject": "art", "n": 0}])
    assert ids.tolist() == [[3, 1], [0, 0]] and numbers.tolist() == [[2.5], [0.0]]  # unseen categories: id 0
    with pytest.raises(ValueError, match="side feature 'n' is missing from input 0"):
        side_feature_tensors(specs, [{"tier": 1, "subject": "law"}])
    with pytest.raises(ValueError, match="side feature 'n' is missing from input 0"):  # NaN is missing
        side_feature_tensors(specs, [{"tier": 1, "subject": "law", "n": float("nan")}])
    with pytest.raises(ValueError, match="'n' of input 0: the model reads 'n' as a number, got inf"):
        side_feature_tensors(specs, [{"tier": 1, "subject": "law", "n": float("inf")}])
    with pytest.raises(ValueError, match="column 'n' has missing values"):
        side_feature_specs({"n": [1, None]})


MISSING = [None, float("nan"), np.float32("nan"), np.float64("nan"), pd.NA, "", "   ", "\t"]
NOT_ONE_VALUE = [[1], ["law"], {"subject": "law"}, (1, 2), np.array([1.0]), b"law", {"law"}]


@pytest.mark.parametrize("value", MISSING)
def test_one_rule_of_missing_for_specs_tensors_and_values(value):
    specs = [{"name": "subject", "kind": "categorical", "categories": ["law"], "dim": 2},
             {"name": "n", "kind": "numeric", "mean": 0.0, "std": 1.0}]
    assert is_missing_side_value(value)
    with pytest.raises(ValueError, match="column 'subject' has missing values"):
        side_feature_specs({"subject": ["law", value]})
    for row in ({"subject": value, "n": 1.0}, {"subject": "law", "n": value}):
        with pytest.raises(ValueError, match="is missing from input 0"):
            side_feature_tensors(specs, [row])
    for spec in specs:
        with pytest.raises(ValueError, match="the value is missing"):
            side_feature_value(spec, value)


@pytest.mark.parametrize("value", [0, -1, 0.0, "0", "law", False, np.int64(-1)])
def test_numbers_and_words_are_never_missing(value):
    assert not is_missing_side_value(value)


@pytest.mark.parametrize("value", NOT_ONE_VALUE)
def test_a_list_or_dict_is_named_never_turned_into_its_string(value):
    kind = type(value).__name__
    with pytest.raises(ValueError, match=f"side feature column 'subject', row 1: expected one value .* got a {kind}"):
        side_feature_specs({"subject": ["law", value]})
    specs = [{"name": "subject", "kind": "categorical", "categories": ["law", str(value)], "dim": 2},
             {"name": "n", "kind": "numeric", "mean": 0.0, "std": 1.0}]
    for row in ({"subject": value, "n": 1.0}, {"subject": "law", "n": value}):
        with pytest.raises(ValueError, match=f"of input 0: expected one value .* got a {kind}"):
            side_feature_tensors(specs, [row])


@given(st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: float(round(x)))))
def test_a_whole_number_is_one_category_however_it_is_stored(number):
    """Learnt from integers (or from text), a category is found from an int, a float64 or float32 (Parquet), a numpy
    integer or its text: the id is the one worked out from the sorted categories, never the unseen 0."""
    number = int(number)
    specs = side_feature_specs({"tier": [number, number + 1]}, categorical=["tier"], dim=2)
    assert specs[0]["categories"] == sorted([str(number), str(number + 1)])
    want = sorted([str(number), str(number + 1)]).index(str(number)) + 1
    forms = [number, float(number), np.float64(number), np.int64(number), str(number), f" {number} "]
    if abs(number) < 2 ** 24:
        forms.append(np.float32(number))
    ids, _ = side_feature_tensors(specs, [{"tier": form} for form in forms])
    assert ids[:, 0].tolist() == [want] * len(forms)


def test_categories_match_by_meaning_and_strings_stay_strings():
    specs = side_feature_specs({"tier": [0.5, 2.0, "007", " pro", True]}, dim=2)
    assert specs[0]["categories"] == sorted(["0.5", "2", "007", "pro", "True"])
    ids, _ = side_feature_tensors(specs, [{"tier": v} for v in (np.float32(0.5), 2, "7", "pro ", np.True_, "2.0")])
    position = {c: i + 1 for i, c in enumerate(specs[0]["categories"])}
    # "7" is not "007" and "2.0" is not the number 2: a string is a category's name as written, never re-read
    assert ids[:, 0].tolist() == [position["0.5"], position["2"], 0, position["pro"], position["True"], 0]
    # a model saved before values were canonicalised learnt a float column as "1.0", "2.0": 1 and 1.0 still find it
    old = [{"name": "tier", "kind": "categorical", "categories": ["1.0", "2.0"], "dim": 2}]
    assert side_feature_tensors(old, [{"tier": 2}, {"tier": 1.0}, {"tier": "1.0"}])[0][:, 0].tolist() == [2, 1, 1]


@pytest.mark.parametrize("specs, words", [
    ([], "non-empty list"),
    ([{"name": "text", "kind": "numeric"}], "reserved"),
    ([{"name": "a", "kind": "numeric"}, {"name": "a", "kind": "numeric"}], "given twice"),
    ([{"name": "a", "kind": "categorical", "categories": []}], "non-empty list of distinct strings"),
    ([{"name": "a", "kind": "numeric", "std": 0}], "'std' positive"),
    ([{"name": "a", "kind": "ordinal"}], "'categorical' or 'numeric'"),
])
def test_bad_specs_are_named(specs, words):
    with pytest.raises(ValueError, match=words):
        check_side_features(specs)
    with pytest.raises(ValueError, match=words):
        DeferralConfig(feature_size=3, route_only=True, num_experts=2, side_features=specs)


def test_the_head_reads_the_side_features_joined_to_the_features(tmp_path):
    torch.manual_seed(0)
    model = EncoderForRouting(DeferralConfig(feature_size=3, route_only=True, num_experts=2, side_features=SPECS)).eval()
    x = torch.randn(4, 3)
    rows = [{"subject": s, "length": n} for s, n in (("law", 6), ("physics", 10), ("history", 18), ("math", 2))]
    ids, numbers = side_feature_tensors(SPECS, rows)
    table = model.side.embeddings[0].weight.detach()
    by_hand = torch.cat([x, table[torch.tensor([1, 3, 0, 2])], ((numbers - 10.0) / 4.0)], dim=1)
    linear = model.head[-1]
    expected = by_hand @ linear.weight.detach().T + linear.bias.detach()
    with torch.no_grad():
        logits = model(features=x, side_categorical=ids, side_numeric=numbers).logits
    torch.testing.assert_close(logits, expected)
    model.save_pretrained(tmp_path / "m")
    loaded = EncoderForDeferral.from_pretrained(tmp_path / "m").eval()
    assert loaded.config.side_features == SPECS
    with torch.no_grad():
        torch.testing.assert_close(loaded(features=x, side_categorical=ids, side_numeric=numbers).logits, logits)
    with pytest.raises(ValueError, match=r"side_numeric must have shape \[batch, 1\].*\['subject', 'length'\]"):
        model(features=x, side_categorical=ids)
    plain = EncoderForRouting(DeferralConfig(feature_size=3, route_only=True, num_experts=2))
    with pytest.raises(ValueError, match="this model has no side features"):
        plain(features=x, side_categorical=ids)


def test_the_pipeline_takes_dict_inputs_with_the_side_features(tmp_path):
    words = "what is law energy force court".split()
    save_tiny_bert(tmp_path / "enc", words)
    torch.manual_seed(0)
    model = EncoderForDeferral.from_encoder_pretrained(str(tmp_path / "enc"), route_only=True, num_experts=2,
                                                       pooling="mean", side_features=SPECS).eval()
    tokenizer = BertTokenizer.from_pretrained(tmp_path / "enc")
    inputs = [{"text": "what is law", "subject": "law", "length": 3}, {"text": "energy force", "subject": "physics",
                                                                       "length": 12.5},
              {"text": "court", "subject": "art", "length": 30}]
    expected = []
    with torch.no_grad():
        for item in inputs:
            ids, numbers = side_feature_tensors(SPECS, [item])
            logits = model(**tokenizer(item["text"], return_tensors="pt"), side_categorical=ids,
                           side_numeric=numbers).logits
            expected.append(torch.sigmoid(logits[0]).tolist())
    router = pipeline("deferral", model=model, tokenizer=tokenizer)
    for batch_size in (1, 3):
        got = [out["expert_accuracy"] for out in router(inputs, batch_size=batch_size)]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="side feature 'length' is missing from input 0"):
        router({"text": "what is law", "subject": "law"})
    with pytest.raises(ValueError, match=r"takes the side features \['subject', 'length'\]: give each input as a dict"):
        router("what is law")
    for value in (*MISSING, *NOT_ONE_VALUE):  # the pipeline follows the one rule too
        for item in ({"text": "law", "subject": value, "length": 3}, {"text": "law", "subject": "law", "length": value}):
            with pytest.raises(ValueError, match="is missing from input 0|of input 0: expected one value"):
                router(item)
    # a number stored as text for a numeric feature, and a stripped category, decide as the values they mean
    same = router([{"text": "court", "subject": " law", "length": "30"}, {"text": "court", "subject": "law",
                                                                         "length": 30}])
    assert same[0]["expert_accuracy"] == same[1]["expert_accuracy"]


def test_the_examples_run():
    failed, tried = doctest.testmod(side_module)
    assert failed == 0 and tried > 0
