"""Tests for hf_defer.data.collator: DataCollatorForDeferral (text padding, head-only features, pixels, errors)."""

from __future__ import annotations

import doctest
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import hf_defer.data.collator as collator_module
from hf_defer.data import DataCollatorForDeferral

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", "ran"]


@pytest.fixture
def tokenizer(tmp_path: Path):
    from transformers import BertTokenizer

    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    # NB: transformers v5 ignores BertTokenizer(vocab_file=...); load the directory instead
    return BertTokenizer.from_pretrained(str(tmp_path))


def test_collator_pads_text_and_keeps_labels(tokenizer):
    texts = ["the cat", "the cat sat on the mat", "dog ran"]
    rows = []
    for i, text in enumerate(texts):
        row = dict(tokenizer(text))
        row.update({"text": text, "labels": i % 3, "expert_labels": (i + 1) % 3})
        rows.append(row)
    batch = DataCollatorForDeferral(tokenizer=tokenizer)(rows)

    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "expert_labels"}
    index = {w: i for i, w in enumerate(WORDS)}
    cls, sep, pad = index["[CLS]"], index["[SEP]"], index["[PAD]"]
    expected = [
        [cls, index["the"], index["cat"], sep, pad, pad, pad, pad],
        [cls] + [index[w] for w in "the cat sat on the mat".split()] + [sep],
        [cls, index["dog"], index["ran"], sep, pad, pad, pad, pad],
    ]
    assert batch["input_ids"].tolist() == expected
    assert batch["attention_mask"].tolist() == [[1] * 4 + [0] * 4, [1] * 8, [1] * 4 + [0] * 4]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [0, 1, 2]
    assert batch["expert_labels"].dtype == torch.long and batch["expert_labels"].tolist() == [1, 2, 0]

    padded = DataCollatorForDeferral(tokenizer=tokenizer, pad_to_multiple_of=5)(rows)
    assert padded["input_ids"].shape == (3, 10)
    fixed = DataCollatorForDeferral(tokenizer=tokenizer, padding="max_length", max_length=12)(rows)
    assert fixed["attention_mask"].sum(dim=1).tolist() == [4, 8, 4] and fixed["input_ids"].shape == (3, 12)


def test_collator_multi_expert_and_numpy(tokenizer):
    rows = [
        {**tokenizer("the cat"), "label": 1, "expert_labels": [1, 0, 2]},
        {**tokenizer("dog"), "label": 0, "expert_labels": [0, 0, 1]},
    ]
    batch = DataCollatorForDeferral(tokenizer=tokenizer)(rows)
    assert "label" not in batch and batch["labels"].tolist() == [1, 0]
    assert batch["expert_labels"].shape == (2, 3) and batch["expert_labels"].dtype == torch.long
    assert batch["expert_labels"].tolist() == [[1, 0, 2], [0, 0, 1]]

    as_numpy = DataCollatorForDeferral(tokenizer=tokenizer, return_tensors="np")(rows)
    assert isinstance(as_numpy["input_ids"], np.ndarray) and as_numpy["expert_labels"].dtype == np.int64


def test_collator_head_only_features_and_pixels():
    rows = [
        {"features": [0.5, -1.0, 2.0], "labels": 2, "expert_labels": 1, "text": "a", "pixel_values": np.ones((3, 2, 2))},
        {"features": [1.5, 0.0, -2.0], "labels": 0, "expert_labels": 0, "text": "b", "pixel_values": np.zeros((3, 2, 2))},
    ]
    batch = DataCollatorForDeferral()(rows)
    assert set(batch) == {"features", "labels", "expert_labels", "pixel_values"}
    assert batch["features"].dtype == torch.float32
    assert batch["features"].tolist() == [[0.5, -1.0, 2.0], [1.5, 0.0, -2.0]]
    assert batch["pixel_values"].shape == (2, 3, 2, 2) and batch["pixel_values"].dtype == torch.float32
    assert batch["pixel_values"].sum().item() == 12.0
    # unlabeled inference batches are fine too
    assert set(DataCollatorForDeferral()([{"features": [1.0]}, {"features": [2.0]}])) == {"features"}


def test_collator_with_dataset_and_dataloader(tokenizer):
    ds = datasets.Dataset.from_dict(
        {"text": ["the cat sat", "dog", "the mat", "cat ran on the mat"], "labels": [0, 1, 2, 1],
         "expert_labels": [[0, 1], [1, 1], [2, 0], [0, 0]]}
    )
    ds = ds.map(lambda batch: tokenizer(batch["text"]), batched=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=DataCollatorForDeferral(tokenizer))
    batches = list(loader)
    assert [b["input_ids"].shape for b in batches] == [(3, 5), (1, 7)]
    assert batches[0]["expert_labels"].tolist() == [[0, 1], [1, 1], [2, 0]]

    head = datasets.Dataset.from_dict({"features": [[0.0, 1.0]] * 4, "labels": [0, 1, 0, 1], "expert_labels": [1] * 4})
    head_batch = next(iter(torch.utils.data.DataLoader(head.with_format("torch"), batch_size=4,
                                                       collate_fn=DataCollatorForDeferral())))
    assert head_batch["features"].shape == (4, 2) and head_batch["expert_labels"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"features": [1.0], "labels": 0}], "no 'expert_labels'"),
        ([{"features": [1.0], "labels": 0, "expert_labels": 1},
          {"features": [1.0], "labels": 0, "expert_labels": [1, 0]}], "same width"),
        ([{"features": [1.0], "labels": 0, "expert_labels": [1]},
          {"features": [1.0], "labels": 0, "expert_labels": [1, 0]}], "same width"),
        ([{"features": [1.0], "labels": 0, "expert_labels": 1.5}], "expert_labels must be an int"),
        ([{"features": [1.0], "labels": [0, 1], "expert_labels": 1}], "labels must be one int"),
        ([{"features": [1.0, 2.0], "labels": 0, "expert_labels": 1},
          {"features": [1.0], "labels": 0, "expert_labels": 1}], "same shape"),
        ([{"input_ids": [2, 3], "labels": 0, "expert_labels": 1}], "tokenizer"),
        ([{"features": [1.0], "labels": 0, "expert_labels": 1}, {"features": [1.0]}], "same keys"),
        ([], "non-empty"),
    ],
)
def test_collator_errors(rows, match):
    with pytest.raises(ValueError, match=match):
        DataCollatorForDeferral()(rows)


def test_collator_argument_validation():
    with pytest.raises(ValueError, match="return_tensors"):
        DataCollatorForDeferral(return_tensors="tf")
    with pytest.raises(ValueError, match="tokenizer"):
        DataCollatorForDeferral(tokenizer="bert-base-uncased")


def test_collator_stacks_side_features_beside_padded_text(tokenizer):
    rows = [{"input_ids": tokenizer("the cat")["input_ids"], "expert_correct": [1.0, 0.0], "side_categorical": [2, 0],
             "side_numeric": [12.5]},
            {"input_ids": tokenizer("the cat sat on the mat")["input_ids"], "expert_correct": [0.0, 1.0],
             "side_categorical": [1, 3], "side_numeric": [-4.0]}]
    batch = DataCollatorForDeferral(tokenizer=tokenizer)(rows)
    assert batch["side_categorical"].dtype == torch.long and batch["side_categorical"].tolist() == [[2, 0], [1, 3]]
    assert batch["side_numeric"].dtype == torch.float32 and batch["side_numeric"].tolist() == [[12.5], [-4.0]]
    assert batch["input_ids"].shape == (2, 8)  # padded to the longest: [CLS] + 6 words + [SEP]


@pytest.mark.parametrize("values", [[[1], [1, 2]], [[1], [-1]], [[1.5], [2.0]]])
def test_collator_refuses_bad_side_categorical(values):
    rows = [{"features": [0.0], "expert_correct": [1.0, 0.0], "side_categorical": value} for value in values]
    with pytest.raises(ValueError, match="side_categorical must be a list of category ids"):
        DataCollatorForDeferral()(rows)


def test_collator_names_a_ragged_nested_label():
    with pytest.raises(ValueError, match=r"`features` row 0: labels must be an int, got \[\[\], \[0\]\]"):
        DataCollatorForDeferral()([{"labels": [[], [0]], "expert_labels": [0]}])


def test_docstring_examples_run():
    result = doctest.testmod(collator_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
