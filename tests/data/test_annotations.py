"""Tests of hf_defer.data.annotations: long -> wide annotation tables and targets built from annotators.

Every expected value below is worked out by hand from the small tables written here (or, for Dawid-Skene, is the
truth the table was generated from), never taken from the code's own output.
"""

from __future__ import annotations

import doctest
import logging
import math

import datasets
import numpy as np
import pandas as pd
import pytest

import hf_defer
import hf_defer.data.annotations as annotations
from hf_defer import aggregate_labels, annotations_to_columns, prepare_deferral_dataset


def long_table() -> pd.DataFrame:
    return pd.DataFrame({
        "item": ["q1", "q1", "q2", "q3", "q3", "q2"],
        "who": ["ann", "bob", "ann", "cy", "ann", "bob"],
        "answer": ["pos", "neg", "neg", "pos", "pos", None],  # bob's q2 row has no answer: skipped
        "text": ["a", "a", "b", "c", "c", "b"],
    })


# The wide table of long_table(), by hand: items in first-seen order, annotators sorted, None where unanswered.
EXPECTED_WIDE = {"item": ["q1", "q2", "q3"], "text": ["a", "b", "c"], "ann": ["pos", "neg", "pos"],
                 "bob": ["neg", None, None], "cy": [None, None, "pos"]}


def test_public_names():
    for name in ("annotations_to_columns", "aggregate_labels"):
        assert name in hf_defer.__all__ and getattr(hf_defer, name) is getattr(annotations, name)
        assert name in hf_defer.data.__all__


def test_long_to_wide_dataframe():
    wide = annotations_to_columns(long_table(), "item", "who", "answer", keep_columns=["text"])
    assert isinstance(wide, pd.DataFrame)
    assert list(wide.columns) == list(EXPECTED_WIDE)
    assert {name: wide[name].tolist() for name in wide.columns} == EXPECTED_WIDE
    assert wide["bob"].tolist()[1] is None  # None, not NaN: what prepare_deferral_dataset reads as missing


def test_long_to_wide_dataset_keeps_features_and_prefix():
    long = datasets.Dataset.from_pandas(long_table(), preserve_index=False)
    wide = annotations_to_columns(long, "item", "who", "answer", keep_columns=["text"], column_prefix="annotator_")
    assert isinstance(wide, datasets.Dataset)
    assert wide.column_names == ["item", "text", "annotator_ann", "annotator_bob", "annotator_cy"]
    assert wide["annotator_cy"][:] == [None, None, "pos"]
    assert wide.features["annotator_bob"] == datasets.Value("string")


def test_classlabel_answers_stay_classlabel_and_feed_prepare_deferral_dataset():
    names = ["neg", "pos"]
    long = datasets.Dataset.from_dict(
        {"item": [0, 0, 0, 1, 1, 2, 2, 2, 3, 3], "who": ["a", "b", "c", "a", "c", "a", "b", "c", "b", "c"],
         "answer": [1, 1, 0, 0, 0, 1, 0, 1, 1, 1], "text": ["t0"] * 3 + ["t1"] * 2 + ["t2"] * 3 + ["t3"] * 2},
        features=datasets.Features({"item": datasets.Value("int64"), "who": datasets.Value("string"),
                                    "answer": datasets.ClassLabel(names=names), "text": datasets.Value("string")}))
    wide = annotations_to_columns(long, "item", "who", "answer", keep_columns=["text"])
    assert wide.features["a"] == datasets.ClassLabel(names=names)
    assert wide["b"][:] == [1, None, 0, 1]
    target = aggregate_labels(wide, ["a", "b", "c"])
    assert target.features["labels"] == datasets.ClassLabel(names=names)
    # by hand: item 0 pos (2-1), item 1 neg (2-0), item 2 pos (2-1), item 3 pos (2-0); no ties
    assert target["labels"][:] == [1, 0, 1, 1] and not any(target["labels_tied"][:])
    prepared = prepare_deferral_dataset(target, "labels", ["a", "b", "c"], text_column="text", missing_expert="drop")
    # items 1 (b missing) and 3 (a missing) are the rows with a missing answer
    assert prepared.dataset.num_rows == 2
    assert prepared.dataset["expert_labels"][:] == [[1, 1, 0], [1, 0, 1]]


def test_min_answers_keeps_annotators_with_enough_answers(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_defer.data.annotations"):
        wide = annotations_to_columns(long_table(), "item", "who", "answer", min_answers=2)
    assert list(wide.columns) == ["item", "ann"]  # ann answered 3 items, bob and cy one each
    assert "bob" in caplog.text and "cy" in caplog.text
    with pytest.raises(ValueError, match=r"`min_answers`=4 removes every annotator.*most answers any annotator gave is 3"):
        annotations_to_columns(long_table(), "item", "who", "answer", min_answers=4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="`min_answers` must be an int >= 1"):
            annotations_to_columns(long_table(), "item", "who", "answer", min_answers=bad)


def repeated_table() -> pd.DataFrame:
    return pd.DataFrame({"item": [1, 1, 1, 2, 2, 3], "who": ["ann", "ann", "ann", "ann", "ann", "bob"],
                         "answer": ["x", "y", "y", "x", "y", "x"]})


def test_repeated_answers_are_an_error_by_default():
    with pytest.raises(ValueError, match=r"annotator 'ann' answered item 1 3 times \(2 repeated .*duplicates="):
        annotations_to_columns(repeated_table(), "item", "who", "answer")


@pytest.mark.parametrize("policy, expected", [("first", ["x", "x", None]), ("last", ["y", "y", None]),
                                              ("majority", ["y", None, None])])
def test_duplicate_policies(policy, expected, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_defer.data.annotations"):
        wide = annotations_to_columns(repeated_table(), "item", "who", "answer", duplicates=policy)
    assert wide["ann"].tolist() == expected
    assert wide["bob"].tolist() == [None, None, "x"]
    # majority: ann said x once and y once on item 2, a tie left missing and reported
    assert ("tied repeated answers" in caplog.text) == (policy == "majority")
    with pytest.raises(ValueError, match="`duplicates` must be one of"):
        annotations_to_columns(repeated_table(), "item", "who", "answer", duplicates="mean")


def test_answers_outside_the_label_set_are_an_error():
    with pytest.raises(ValueError, match=r"column 'answer' holds answers outside `label_names` \['neg', 'pos'\]: 'POS'"):
        table = long_table()
        table.loc[3, "answer"] = "POS"
        annotations_to_columns(table, "item", "who", "answer", label_names=["neg", "pos"])
    wide = pd.DataFrame({"a": ["neg", "maybe"], "b": ["pos", None]})
    with pytest.raises(ValueError, match=r"column 'a' holds answers outside `label_names`.*'maybe' \(rows \[1\]\)"):
        aggregate_labels(wide, ["a", "b"], label_names=["neg", "pos"])


@pytest.mark.parametrize("missing", [None, float("nan"), ""])
def test_missing_annotator_ids_are_an_error(missing):
    table = long_table()
    table["who"] = table["who"].astype(object)
    table.loc[2, "who"] = missing
    with pytest.raises(ValueError, match=r"column 'who' \(`annotator_column`\) has no id in 1 row\(s\), e.g. rows \[2\]"):
        annotations_to_columns(table, "item", "who", "answer")


def test_other_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"`answer_column`: column\(s\) \['label'\] not found"):
        annotations_to_columns(long_table(), "item", "who", "label")
    table = long_table()
    table.loc[0, "item"] = None
    with pytest.raises(ValueError, match=r"column 'item' \(`item_column`\) has no id"):
        annotations_to_columns(table, "item", "who", "answer")
    numeric = pd.DataFrame({"item": [1, 2], "who": ["a", "a"], "answer": [0, -1]})
    with pytest.raises(ValueError, match=r"holds the answer -1 in rows \[1\]"):
        annotations_to_columns(numeric, "item", "who", "answer")
    with pytest.raises(ValueError, match=r"holds the answer -1 in rows \[0\]"):
        annotations_to_columns(numeric.assign(answer=["-1", "0"]), "item", "who", "answer")
    with pytest.raises(ValueError, match="`keep_columns`: column 'who' has different values for item 'q1'"):
        annotations_to_columns(long_table(), "item", "who", "answer", keep_columns=["who"])
    clash = pd.DataFrame({"item": [1, 2], "who": ["item", "b"], "answer": ["x", "y"]})
    with pytest.raises(ValueError, match="collide"):
        annotations_to_columns(clash, "item", "who", "answer")
    with pytest.raises(ValueError, match="must be a datasets.Dataset or a pandas.DataFrame"):
        annotations_to_columns({"item": [1]}, "item", "who", "answer")


def majority_table() -> pd.DataFrame:
    return pd.DataFrame({
        "w": ["a", "a", "a", None, "c", "b"],
        "x": ["a", "b", "b", None, "c", float("nan")],
        "y": ["b", "c", None, None, "c", -1],  # NaN and -1 are missing answers, as prepare_deferral_dataset reads them
        "z": [None, None, None, None, "b", "b"],
    })


def test_majority_by_hand_with_ties_marked(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_defer.data.annotations"):
        out = aggregate_labels(majority_table(), ["w", "x", "y", "z"], output_column="target")
    # rows: a,a,b -> a | a,b,c -> 3-way tie | a,b -> tie | nothing -> None (not a tie) | c,c,c,b -> c | b,b -> b
    assert out["target"].tolist() == ["a", None, None, None, "c", "b"]
    assert out["target_tied"].tolist() == [False, True, True, False, False, False]
    assert "{'target_tied': 2}" in caplog.text
    assert list(majority_table().columns) == ["w", "x", "y", "z"]  # the input is not modified


def test_leave_one_out_by_hand_including_ties():
    wide = pd.DataFrame({"A": ["a", "a", "a", "b"], "B": ["a", "b", None, None], "C": ["b", "b", "a", None]})
    out = aggregate_labels(wide, ["A", "B", "C"], method="leave_one_out")
    # A against B and C: (a, b) tie | (b, b) b | (a) a | nobody else answered
    assert out["A_loo_target"].tolist() == [None, "b", "a", None]
    assert out["A_loo_tied"].tolist() == [True, False, False, False]
    # B against A and C: (a, b) tie | (a, b) tie | (a, a) a | (b) b  -- defined where B did not answer
    assert out["B_loo_target"].tolist() == [None, None, "a", "b"]
    assert out["B_loo_tied"].tolist() == [True, True, False, False]
    # C against A and B: (a, a) a | (a, b) tie | (a) a | (b) b
    assert out["C_loo_target"].tolist() == ["a", None, "a", "b"]
    assert out["C_loo_tied"].tolist() == [False, True, False, False]
    # the plain majority of row 0 is "a": A would be graded against their own vote without leave-one-out
    assert aggregate_labels(wide, ["A", "B", "C"])["labels"].tolist()[0] == "a"


def test_leave_one_out_on_a_dataset():
    wide = datasets.Dataset.from_dict({"A": [0, 1, 1], "B": [0, None, 1], "C": [1, 1, 0]})
    out = aggregate_labels(wide, ["A", "B", "C"], method="leave_one_out")
    assert out["A_loo_target"][:] == [None, 1, None]  # (0, 1) tie | (1) | (1, 0) tie
    assert out["C_loo_target"][:] == [0, 1, 1]
    assert out.features["A_loo_tied"] == datasets.Value("bool")


def test_dawid_skene_recovers_the_truth_where_majority_fails():
    """One reliable annotator and two adversarial ones who, independently, answer the next class 60 % of the time."""
    pytest.importorskip("crowdkit")
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, 300)
    names = np.array(["cat", "dog", "fox"])
    shifted = lambda: np.where(rng.random(truth.size) < 0.6, (truth + 1) % 3, truth)  # noqa: E731
    wide = pd.DataFrame({"reliable": names[truth], "adversary_1": names[shifted()], "adversary_2": names[shifted()]})
    columns = list(wide.columns)
    majority = aggregate_labels(wide, columns)["labels"].to_numpy()
    assert (majority == names[truth]).mean() < 0.75  # the two adversaries outvote the reliable annotator
    out = aggregate_labels(wide, columns, method="dawid_skene")
    assert out["labels"].tolist() == names[truth].tolist()
    assert not out["labels_tied"].any()


def test_dawid_skene_reports_a_symmetric_tie():
    pytest.importorskip("crowdkit")
    # two annotators who always disagree, symmetrically: every posterior is exactly 1/2
    wide = pd.DataFrame({"A": ["x", "y", None], "B": ["y", "x", None]})
    out = aggregate_labels(wide, ["A", "B"], method="dawid_skene")
    assert out["labels"].tolist() == [None, None, None]
    assert out["labels_tied"].tolist() == [True, True, False]


def test_dawid_skene_without_crowd_kit_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_crowdkit(name, *args, **kwargs):
        if name.startswith("crowdkit"):
            raise ImportError("No module named 'crowdkit'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_crowdkit)
    with pytest.raises(ImportError, match=r"pip install 'hf-defer\[crowd\]'"):
        aggregate_labels(pd.DataFrame({"A": ["x"], "B": ["x"]}), ["A", "B"], method="dawid_skene")


def test_aggregate_bad_arguments():
    wide = pd.DataFrame({"A": ["x"], "B": ["y"], "labels": ["x"]})
    with pytest.raises(ValueError, match="`method` must be one of"):
        aggregate_labels(wide, ["A", "B"], method="mean")
    with pytest.raises(ValueError, match=r"already has the output column\(s\) \['labels'\]"):
        aggregate_labels(wide, ["A", "B"])
    with pytest.raises(ValueError, match="needs at least two `annotator_columns`"):
        aggregate_labels(wide, ["A"], method="leave_one_out")
    with pytest.raises(ValueError, match=r"`annotator_columns`: column\(s\) \['C'\] not found"):
        aggregate_labels(wide, ["A", "C"])
    with pytest.raises(ValueError, match="names \\['A'\\] more than once"):
        aggregate_labels(wide, ["A", "A"])
    with pytest.raises(ValueError, match="non-empty list of column names"):
        aggregate_labels(wide, "A")


def test_nan_answers_in_a_float_column_are_missing():
    wide = pd.DataFrame({"A": [1.0, np.nan, 0.0], "B": [1.0, 0.0, np.nan]})
    out = aggregate_labels(wide, ["A", "B"])
    assert out["labels"].tolist() == [1, 0, 0]  # integral floats become class ids
    assert all(isinstance(value, int) for value in out["labels"]) and not math.isnan(out["labels"][1])


def test_docstring_examples():
    result = doctest.testmod(annotations, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
