"""`prepare_deferral_dataset(..., side_feature_columns=...)`: side features carried into the batch as category ids and
numbers (ids and statistics worked out by hand here), a saved model's specs reused for new data, and the data's
mistakes named by column and row."""

from __future__ import annotations

import math

import datasets
import numpy as np
import pytest
import torch
from transformers import TrainingArguments

from hf_defer import DataCollatorForDeferral, DeferralConfig, DeferralTrainer, EncoderForDeferral, EncoderForRouting
from hf_defer import prepare_deferral_dataset

ROUTES = {"prompt": ["a", "b", "c", "d"], "small": [True, False, True, None], "large": [1, 1, 0, 1],
          "subject": ["math", "law", "math", "art"], "length": [10, 20, 40, 50]}


def _prepare(table, **kwargs):
    return prepare_deferral_dataset(table, None, expert_correct_columns=["small", "large"], text_column="prompt",
                                    **kwargs)


def test_side_features_become_ids_and_numbers_with_the_training_split_statistics():
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict(ROUTES),
        "validation": datasets.Dataset.from_dict({"prompt": ["e", "f"], "small": [True, False], "large": [1, 0],
                                                  "subject": ["law", "music"], "length": [30, -1]})})
    prepared = _prepare(splits, side_feature_columns=["subject", "length"], missing_expert="drop",
                        side_feature_dim=3)
    subject, length = prepared.side_features
    assert subject == {"name": "subject", "kind": "categorical", "categories": ["art", "law", "math"], "dim": 3}
    # the training rows' mean and population standard deviation (the dropped row 3 still counts: its features are
    # known), by hand: mean 30, variance (400 + 100 + 100 + 400) / 4 = 250
    assert length["kind"] == "numeric" and length["mean"] == pytest.approx(30.0)
    assert length["std"] == pytest.approx(math.sqrt(250.0))
    train, validation = prepared.dataset["train"], prepared.dataset["validation"]
    # row 3 (no answer of 'small') is dropped: the side features of the rows kept stay with their rows
    assert train["side_categorical"][:] == [[3], [2], [3]] and train["side_numeric"][:] == [[10.0], [20.0], [40.0]]
    assert validation["side_categorical"][:] == [[2], [0]]  # 'music' was not seen in training: id 0
    assert validation["side_numeric"][:] == [[30.0], [-1.0]]  # -1 is a number here, not a missing value
    assert prepared.model_kwargs()["side_features"] == prepared.side_features
    # a model built from them takes the batch as the collator makes it
    model = EncoderForRouting(DeferralConfig(feature_size=2, **prepared.model_kwargs()))
    rows = [{**row, "features": [0.5, -0.5]} for row in validation.select_columns(
        ["expert_correct", "side_categorical", "side_numeric"])]
    batch = DataCollatorForDeferral()(rows)
    assert batch["side_categorical"].dtype == torch.long and batch["side_numeric"].dtype == torch.float32
    assert model(**batch).loss is not None


def test_numbers_named_categorical_are_categories_and_a_models_specs_are_reused():
    table = datasets.Dataset.from_dict({**ROUTES, "tier": [1, 2, 3, 1]})
    prepared = _prepare(table, side_feature_columns=["tier"], categorical_side_features=["tier"], missing_expert="mask")
    assert prepared.side_features[0]["categories"] == ["1", "2", "3"]
    assert prepared.dataset["side_categorical"][:] == [[1], [2], [3], [1]]
    assert "side_numeric" not in prepared.dataset.column_names  # no numeric side feature: no column
    new = datasets.Dataset.from_dict({"prompt": ["x", "y"], "small": [1, 0], "large": [1, 1], "tier": [3, 7]})
    again = _prepare(new, side_feature_columns=prepared.side_features)  # a saved model's config.side_features
    assert again.side_features == prepared.side_features and again.dataset["side_categorical"][:] == [[3], [0]]
    with pytest.raises(ValueError, match="categorical_side_features .* given by the specs"):
        _prepare(new, side_feature_columns=prepared.side_features, categorical_side_features=["tier"])


@pytest.mark.parametrize("change, kwargs, message", [
    ({"length": [10.0, float("nan"), 40.0, 50.0]}, {}, "side feature column 'length', row 1: the value is missing"),
    ({"subject": ["math", None, "law", " "]}, {}, r"side feature column 'subject', row 1: the value is missing .* in 2"),
    ({"length": ["10", "20", "lots", "50"]}, {}, "'length' holds mostly numbers but row 2 holds 'lots'"),
    ({"length": ["10", "20", "30", "50"]}, {}, "'length' holds numbers written as text"),
    ({"length": [10.0, 20.0, float("inf"), 50.0]}, {}, "'length', row 2: inf is not a finite number"),
    ({"length": [[1], [2], [3], [4]]}, {}, "holds lists or dicts"),
    ({}, {"side_feature_columns": ["subject", "tier"]}, r"side feature column\(s\) \['tier'\] not found"),
    ({}, {"side_feature_columns": ["subject", "subject"]}, "name a column twice"),
    ({}, {"side_feature_columns": ["prompt"]}, r"\['prompt'\] are also the label, an expert or the input"),
    ({}, {"side_feature_columns": ["small"]}, r"\['small'\] are also the label, an expert or the input"),
    ({}, {"side_feature_columns": ["subject"], "categorical_side_features": ["length"]}, "must be among"),
    ({}, {"side_feature_columns": ["subject"], "side_feature_dim": 0}, "side_feature_dim must be a positive"),
])
def test_bad_side_features_are_named(change, kwargs, message):
    table = datasets.Dataset.from_dict({**ROUTES, "small": [True, False, True, False], **change})
    with pytest.raises(ValueError, match=message):
        _prepare(table, **({"side_feature_columns": ["subject", "length"]} | kwargs))


def test_a_models_numeric_feature_refuses_a_word_naming_the_split_and_row():
    specs = [{"name": "length", "kind": "numeric", "mean": 0.0, "std": 1.0}]
    table = datasets.DatasetDict({"test": datasets.Dataset.from_dict(
        {"prompt": ["a", "b", "c"], "small": [1, 0, 1], "large": [1, 1, 1], "length": ["3", "long", "5"]})})
    with pytest.raises(ValueError, match="'length' of split 'test', row 1: the model reads 'length' as a number, "
                                         "got 'long'"):
        _prepare(table, side_feature_columns=specs)


def test_a_head_only_classifier_with_side_features_trains_them():
    # the trainer's head-only fast path holds features, labels and targets only: with side features it steps aside
    rng = np.random.default_rng(0)
    table = datasets.Dataset.from_dict({"features": rng.normal(size=(16, 2)).tolist(), "label": [0, 1] * 8,
                                        "alice": [0, 1, 1, 0] * 4, "tier": ["free", "pro"] * 8})
    prepared = prepare_deferral_dataset(table, "label", ["alice"], side_feature_columns=["tier"])
    data = prepared.dataset.add_column("features", table["features"][:])
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=2, **prepared.model_kwargs()))
    before = model.side.embeddings[0].weight.detach().clone()
    args = TrainingArguments("unused", num_train_epochs=1, per_device_train_batch_size=8, learning_rate=0.1,
                             report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True)
    DeferralTrainer(model=model, args=args, train_dataset=data).train()
    assert not torch.allclose(model.side.embeddings[0].weight, before)


def test_a_category_column_of_floats_learns_the_categories_its_integers_would():
    """Training on a float column (a pandas int column with a gap becomes float64) learns "1", "2", not "1.0": the
    category of an integer 1 at prediction time; blank and NaN are missing, as everywhere."""
    table = datasets.Dataset.from_dict({**ROUTES, "tier": [1.0, 2.0, 1.0, 2.0]})
    prepared = _prepare(table, side_feature_columns=["tier"], categorical_side_features=["tier"],
                        missing_expert="mask")
    assert prepared.side_features[0]["categories"] == ["1", "2"]
    assert prepared.dataset["side_categorical"] == [[1], [2], [1], [2]]
    for missing in ([1.0, float("nan"), 1.0, 2.0], ["a", "b", "", "a"], ["a", None, "\t", "b"]):
        with pytest.raises(ValueError, match=r"side feature column 'tier', row [12]: the value is missing"):
            _prepare(datasets.Dataset.from_dict({**ROUTES, "tier": missing}), side_feature_columns=["tier"],
                     categorical_side_features=["tier"], missing_expert="mask")
