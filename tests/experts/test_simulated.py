"""Tests for hf_defer.experts: simulated experts checked against their known distributions."""

from __future__ import annotations

import doctest
import io
import math

import datasets
import numpy as np
import pandas as pd
import pytest
from scipy import stats

import hf_defer.experts.simulated as experts_module
from hf_defer.data.bundled_data import bundled_bytes
from hf_defer.experts import (
    annotator_accuracy,
    annotator_expert,
    class_subset_expert,
    dialect_biased_expert,
    stack_experts,
)



def binomial_tolerance(p: float, n: int, z: float = 5.0) -> float:
    """z standard deviations of a sample frequency of n Bernoulli(p) draws."""
    return z * math.sqrt(p * (1.0 - p) / n)


def counts_dataset(rows: list[list[int]]) -> datasets.Dataset:
    array = np.asarray(rows)
    return datasets.Dataset.from_dict({f"c{j}": array[:, j].tolist() for j in range(array.shape[1])})


# --------------------------------------------------------------------------------------------- annotator_expert


def test_annotator_expert_is_reproducible_and_seed_dependent():
    ds = counts_dataset([[1, 1, 1]] * 300)
    first = annotator_expert(ds, ["c0", "c1", "c2"], seed=7)["expert_labels"][:]
    again = annotator_expert(ds, ["c0", "c1", "c2"], seed=7)["expert_labels"][:]
    other = annotator_expert(ds, ["c0", "c1", "c2"], seed=8)["expert_labels"][:]
    assert first == again
    # two independent uniform draws over 3 classes agree on all 300 rows with probability 3**-300
    assert first != other
    from_generator = annotator_expert(ds, ["c0", "c1", "c2"], seed=np.random.default_rng(7))["expert_labels"][:]
    assert from_generator == first


def test_annotator_expert_frequencies_match_counts():
    n = 20_000
    ds = counts_dataset([[1, 2, 0]] * n)
    out = annotator_expert(ds, ["c0", "c1", "c2"], seed=0)
    labels = np.asarray(out["expert_labels"][:])
    assert out.features["expert_labels"] == datasets.Value("int64")
    assert out.column_names == ["c0", "c1", "c2", "expert_labels"]
    assert abs(np.mean(labels == 0) - 1 / 3) < binomial_tolerance(1 / 3, n)
    assert abs(np.mean(labels == 1) - 2 / 3) < binomial_tolerance(2 / 3, n)
    assert not np.any(labels == 2)  # a class nobody chose is never drawn


def test_annotator_expert_unanimous_rows_are_deterministic():
    ds = counts_dataset([[3, 0, 0], [0, 5, 0], [0, 0, 9], [0, 4, 0]])
    assert annotator_expert(ds, ["c0", "c1", "c2"], seed=3)["expert_labels"][:] == [0, 1, 2, 1]


def test_annotator_expert_list_column_and_frequencies():
    n = 20_000
    # integer counts in one list-valued column
    ds = datasets.Dataset.from_dict({"votes": [[0, 3, 1]] * n})
    labels = np.asarray(annotator_expert(ds, "votes", seed=1)["expert_labels"][:])
    assert abs(np.mean(labels == 1) - 0.75) < binomial_tolerance(0.75, n)
    assert set(np.unique(labels)) <= {1, 2}
    # non-integer frequencies use inverse-CDF sampling
    ds = datasets.Dataset.from_dict({"dist": [[0.25, 0.0, 0.75]] * n})
    labels = np.asarray(annotator_expert(ds, "dist", seed=1)["expert_labels"][:])
    assert abs(np.mean(labels == 0) - 0.25) < binomial_tolerance(0.25, n)
    assert not np.any(labels == 1)


def test_annotator_expert_respects_row_selection_and_replaces_column():
    ds = counts_dataset([[2, 0], [0, 2], [2, 0], [0, 2]]).select([3, 0, 1])
    out = annotator_expert(ds, ["c0", "c1"], seed=0)
    assert out["expert_labels"][:] == [1, 0, 1]
    again = annotator_expert(out, ["c0", "c1"], seed=0)  # existing column is replaced, not duplicated
    assert again.column_names.count("expert_labels") == 1
    assert annotator_expert(ds.select([]), ["c0", "c1"]).num_rows == 0


def test_hatespeech_random_annotator_accuracy_matches_readme():
    frame = pd.read_csv(io.BytesIO(bundled_bytes("hatespeech/labeled_data.csv")), index_col=0)
    counts = frame[["hate_speech", "offensive_language", "neither"]].to_numpy()
    classes = frame["class"].to_numpy()
    per_row = counts[np.arange(len(frame)), classes] / frame["count"].to_numpy()
    expected = per_row.mean()
    assert expected == pytest.approx(0.905, abs=5e-4)  # value stated in shared/data/README.md

    ds = datasets.Dataset.from_pandas(
        frame[["hate_speech", "offensive_language", "neither", "class"]], preserve_index=False
    )
    sampled = np.asarray(
        annotator_expert(ds, ["hate_speech", "offensive_language", "neither"], seed=0)["expert_labels"][:]
    )
    # every draw is a class that at least one annotator of that tweet chose
    assert np.all(counts[np.arange(len(frame)), sampled] > 0)
    accuracy = np.mean(sampled == classes)
    sd = math.sqrt(np.sum(per_row * (1 - per_row))) / len(frame)  # sd of a mean of independent Bernoullis
    assert abs(accuracy - expected) < 5 * sd


@pytest.mark.parametrize(
    "rows, columns, match",
    [
        ([[0, 0, 0], [1, 0, 0]], ["c0", "c1", "c2"], r"rows \[0\].*sum"),
        ([[1, -1, 2]], ["c0", "c1", "c2"], "non-negative"),
        ([[1, 1, 1]], ["c0", "missing"], r"count_columns.*\['missing'\]"),
        ([[1, 1, 1]], [], "non-empty"),
        ([[1, 1, 1]], ["c0", "c0"], "repeat"),
    ],
)
def test_annotator_expert_rejects_bad_counts(rows, columns, match):
    with pytest.raises(ValueError, match=match):
        annotator_expert(counts_dataset(rows), columns)


def test_annotator_expert_rejects_bad_arguments():
    ds = counts_dataset([[1, 2]])
    with pytest.raises(ValueError, match="finite"):
        annotator_expert(datasets.Dataset.from_dict({"a": [float("nan")], "b": [1.0]}), ["a", "b"])
    with pytest.raises(ValueError, match="same K"):
        annotator_expert(datasets.Dataset.from_dict({"v": [[1, 2], [1, 2, 3]]}), "v")
    with pytest.raises(ValueError, match="list-valued"):
        annotator_expert(ds, "c0")
    with pytest.raises(ValueError, match="real numbers"):
        annotator_expert(datasets.Dataset.from_dict({"a": ["x"], "b": ["y"]}), ["a", "b"])
    with pytest.raises(ValueError, match="`column`"):
        annotator_expert(ds, ["c0", "c1"], column="c1")
    with pytest.raises(ValueError, match="`seed`"):
        annotator_expert(ds, ["c0", "c1"], seed=-1)
    with pytest.raises(ValueError, match="DatasetDict"):
        annotator_expert(datasets.DatasetDict({"train": ds}), ["c0", "c1"])
    with pytest.raises(ValueError, match="datasets.Dataset"):
        annotator_expert({"c0": [1]}, ["c0"])


# ------------------------------------------------------------------------------------------ class_subset_expert


def test_class_subset_expert_accuracy_and_uniform_errors():
    num_classes, k, p, per_class = 10, 4, 0.7, 3_000
    labels = np.repeat(np.arange(num_classes), per_class)
    ds = datasets.Dataset.from_dict({"labels": labels})
    out = class_subset_expert(ds, num_classes=num_classes, k=k, p=p, seed=0)
    expert = np.asarray(out["expert_labels"][:])
    known = labels < k

    expected_known = p + (1 - p) / num_classes  # 0.73
    assert abs(np.mean(expert[known] == labels[known]) - expected_known) < binomial_tolerance(
        expected_known, known.sum()
    )
    assert abs(np.mean(expert[~known] == labels[~known]) - 1 / num_classes) < binomial_tolerance(
        1 / num_classes, (~known).sum()
    )
    # on the unknown classes the answer is uniform over all classes, whatever the true label
    frequencies = np.bincount(expert[~known], minlength=num_classes)
    assert stats.chisquare(frequencies).pvalue > 1e-4
    assert expert.min() >= 0 and expert.max() < num_classes


def test_class_subset_expert_extremes_and_reproducibility():
    labels = np.tile(np.arange(5), 400)
    ds = datasets.Dataset.from_dict({"y": labels})
    perfect = class_subset_expert(ds, 5, k=5, p=1.0, label_column="y", column="m")
    assert perfect["m"][:] == labels.tolist()
    partial = np.asarray(class_subset_expert(ds, 5, k=2, p=1.0, label_column="y", column="m", seed=4)["m"][:])
    np.testing.assert_array_equal(partial[labels < 2], labels[labels < 2])
    a = class_subset_expert(ds, 5, k=3, p=0.5, label_column="y", seed=11)["expert_labels"][:]
    b = class_subset_expert(ds, 5, k=3, p=0.5, label_column="y", seed=11)["expert_labels"][:]
    assert a == b
    # p = 0: uniform everywhere, accuracy 1/K on the known classes as well
    blind = np.asarray(class_subset_expert(ds, 5, k=5, p=0.0, label_column="y", seed=2)["expert_labels"][:])
    assert abs(np.mean(blind == labels) - 0.2) < binomial_tolerance(0.2, len(labels))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_classes": 0, "k": 1, "p": 0.5}, "num_classes"),
        ({"num_classes": 3, "k": 0, "p": 0.5}, "`k`"),
        ({"num_classes": 3, "k": 4, "p": 0.5}, "`k`"),
        ({"num_classes": 3, "k": 2, "p": -0.1}, "`p`"),
        ({"num_classes": 3, "k": 2, "p": 1.5}, "`p`"),
        ({"num_classes": 3, "k": 2, "p": float("nan")}, "`p`"),
        ({"num_classes": 2, "k": 1, "p": 0.5}, r"\[0, 2\).*rows \[2\]"),
        ({"num_classes": 3, "k": 1, "p": 0.5, "label_column": "nope"}, "label_column"),
        ({"num_classes": 3, "k": 1, "p": 0.5, "column": "labels"}, "must differ"),
    ],
)
def test_class_subset_expert_validates(kwargs, match):
    ds = datasets.Dataset.from_dict({"labels": [0, 1, 2]})
    with pytest.raises(ValueError, match=match):
        class_subset_expert(ds, **kwargs)


# ----------------------------------------------------------------------------------------------- stack_experts


def test_stack_experts_orders_and_removes():
    ds = datasets.Dataset.from_dict({"a": [0, 1, 2], "b": [2, 1, 0], "text": ["x", "y", "z"]})
    out = stack_experts(ds, ["b", "a"])
    assert out.column_names == ["text", "expert_labels"]
    assert out["expert_labels"][:] == [[2, 0], [1, 1], [0, 2]]
    assert out.features["expert_labels"] == datasets.List(datasets.Value("int64"), length=2)
    assert out.with_format("torch")["expert_labels"][:].shape == (3, 2)

    kept = stack_experts(ds, ["a", "b"], column="experts", remove_columns=False)
    assert kept.column_names == ["a", "b", "text", "experts"]
    assert kept["experts"][:] == [[0, 2], [1, 1], [2, 0]]
    # the output may reuse an input name when the inputs are removed
    reuse = stack_experts(ds.rename_column("a", "expert_labels"), ["expert_labels", "b"])
    assert reuse["expert_labels"][:] == [[0, 2], [1, 1], [2, 0]]
    # one expert gives lists of length one
    assert stack_experts(ds, ["a"])["expert_labels"][:] == [[0], [1], [2]]


@pytest.mark.parametrize(
    "columns, kwargs, match",
    [
        ([], {}, "non-empty"),
        ("a", {}, "non-empty sequence"),
        (["a", "a"], {}, "repeat"),
        (["a", "zzz"], {}, "zzz"),
        (["a", "text"], {}, "integer"),
        (["a", "b"], {"column": "a", "remove_columns": False}, "remove_columns=True"),
    ],
)
def test_stack_experts_validates(columns, kwargs, match):
    ds = datasets.Dataset.from_dict({"a": [0, 1], "b": [1, 0], "text": ["x", "y"]})
    with pytest.raises(ValueError, match=match):
        stack_experts(ds, columns, **kwargs)


def test_docstring_examples_run():
    result = doctest.testmod(experts_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- dialect-biased expert
def test_dialect_expert_deterministic_extremes():
    ds = datasets.Dataset.from_dict({"labels": [0, 1, 2, 1, 0, 2], "aae": [True, True, True, False, False, False]})
    out = dialect_biased_expert(ds, "aae", num_classes=3, p_aae=1.0, p_other=1.0, seed=3)
    assert out["expert_labels"] == [0, 1, 2, 1, 0, 2]
    assert out.column_names == ["labels", "aae", "expert_labels"]


def test_dialect_expert_accuracy_rates():
    n = 40_000
    flags = np.arange(n) < n // 2
    ds = datasets.Dataset.from_dict({"labels": np.arange(n) % 3})
    out = dialect_biased_expert(ds, flags, num_classes=3, p_aae=0.4, p_other=0.9, seed=0)
    table = out.with_format("numpy")[:]
    right = table["expert_labels"] == table["labels"]
    # right w.p. p, plus a uniform guess that is right 1/3 of the time: p + (1 - p) / 3.
    assert right[flags].mean() == pytest.approx(0.4 + 0.6 / 3, abs=0.015)
    assert right[~flags].mean() == pytest.approx(0.9 + 0.1 / 3, abs=0.01)
    again = dialect_biased_expert(ds, flags, num_classes=3, p_aae=0.4, p_other=0.9, seed=0)
    np.testing.assert_array_equal(again.with_format("numpy")[:]["expert_labels"], table["expert_labels"])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"aae": [True]}, ValueError, "`aae` must hold one bool per example"),
        ({"aae": "missing"}, ValueError, r"`aae` names column\(s\) \['missing'\]"),
        ({"p_aae": 1.5}, ValueError, "`p_aae` must be a probability"),
        ({"num_classes": 1}, ValueError, "`num_classes` must be an int >= 2"),
        ({"num_classes": 2}, ValueError, r"labels in \[0, 2\)"),
        ({"label_column": "y"}, ValueError, r"`label_column` names column\(s\) \['y'\]"),
    ],
)
def test_dialect_expert_rejects_bad_input(kwargs, error, message):
    ds = datasets.Dataset.from_dict({"labels": [0, 2], "aae": [True, False]})
    arguments = {"aae": "aae", "num_classes": 3} | kwargs
    with pytest.raises(error, match=message):
        dialect_biased_expert(ds, **arguments)


def test_dialect_expert_rejects_non_dataset():
    with pytest.raises(ValueError, match="datasets.Dataset"):  # the exception type of every expert here
        dialect_biased_expert({"labels": [0]}, [True], num_classes=3)


# ----------------------------------------------------------------------------- true accuracy of the annotator
def test_annotator_accuracy_by_hand():
    ds = datasets.Dataset.from_dict({"labels": [0, 1, 2], "count": [3, 6, 4], "hate_speech": [2, 1, 0],
                                     "offensive_language": [1, 4, 1], "neither": [0, 1, 3]})
    columns = ["hate_speech", "offensive_language", "neither"]
    np.testing.assert_allclose(annotator_accuracy(ds, columns), [2 / 3, 4 / 6, 3 / 4])


def test_annotator_accuracy_is_the_mean_correctness_of_annotator_expert():
    # 2 of 3 annotators chose class 0 on every row: the expert is right 2/3 of the time.
    n = 30_000
    ds = datasets.Dataset.from_dict({"labels": [0] * n, "a": [2] * n, "b": [1] * n})
    drawn = np.asarray(annotator_expert(ds, ["a", "b"], seed=0)["expert_labels"])
    np.testing.assert_allclose(annotator_accuracy(ds, ["a", "b"]), 2 / 3)
    assert (drawn == 0).mean() == pytest.approx(2 / 3, abs=0.01)
    with pytest.raises(ValueError, match=r"labels in \[0, 2\)"):
        annotator_accuracy(datasets.Dataset.from_dict({"labels": [2], "a": [1], "b": [1]}), ["a", "b"])

