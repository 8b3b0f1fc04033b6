"""Tests of hf_defer.in_memory: the rows it serves are the dataset's rows."""

from __future__ import annotations

import doctest

import datasets
import numpy as np
import torch

import hf_defer.in_memory as in_memory
from hf_defer.in_memory import InMemoryRows


def _split(n: int = 20) -> datasets.Dataset:
    rng = np.random.default_rng(0)
    return datasets.Dataset.from_dict({"features": rng.normal(size=(n, 8)).astype(np.float32),
                                       "labels": rng.integers(0, 3, n), "expert_labels": rng.integers(0, 3, n)})


def test_in_memory_rows_match_the_dataset():
    split = _split(20)
    rows = InMemoryRows(split)
    assert len(rows) == 20
    for got, index in zip(rows.__getitems__([7, 0, 19]), [7, 0, 19]):
        expected = split[index]
        np.testing.assert_array_equal(got["features"], np.asarray(expected["features"], dtype=np.float32))
        assert got["labels"] == expected["labels"] and got["expert_labels"] == expected["expert_labels"]


def test_a_dataloader_batches_the_rows_in_order():
    split = _split(10)
    loader = torch.utils.data.DataLoader(InMemoryRows(split), batch_size=4, collate_fn=lambda rows: rows)
    batches = list(loader)
    assert [len(batch) for batch in batches] == [4, 4, 2]
    assert [int(row["labels"]) for batch in batches for row in batch] == list(split["labels"])


def test_docstring_examples_run():
    result = doctest.testmod(in_memory, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
