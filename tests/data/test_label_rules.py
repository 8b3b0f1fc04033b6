"""The label rules of hf_defer.data.labels, through prepare_deferral_dataset as a new user meets them with messy labels:
classes from the training split (or label_names), stripped names, case twins and "defer" refused, one set of missing
markers, integer labels named by their values, one kind per column, and a prepared split checked against the model's
classes by DeferralTrainer."""

from __future__ import annotations

import doctest
import re

import datasets
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from transformers import TrainingArguments

from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral, prepare_deferral_dataset
from hf_defer.data.labels import check_label_names, is_missing


def splits(train: dict, test: dict) -> datasets.DatasetDict:
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(train), "test": datasets.Dataset.from_dict(test)})


def test_a_class_seen_only_in_the_test_split_is_an_error_naming_split_row_and_value():
    data = splits({"label": ["neg", "pos", "neg"], "e": ["neg", "pos", "pos"]},
                  {"label": ["pos", "neu"], "e": ["pos", "pos"]})
    with pytest.raises(ValueError, match=r"column 'label' of split 'test', row 1: 'neu' is not one of the 2 classes "
                                         r"\['neg', 'pos'\].*label_names"):
        prepare_deferral_dataset(data, "label", "e")
    # Declared, it is a class, and its id does not shift the others' order (sorted names are not used then).
    prepared = prepare_deferral_dataset(data, "label", "e", label_names=["neg", "pos", "neu"])
    assert prepared.dataset["test"]["labels"][:] == [1, 2]
    # The training split is "train" whatever the order of the splits.
    reordered = datasets.DatasetDict({"test": data["test"], "train": data["train"]})
    with pytest.raises(ValueError, match=r"split 'test', row 1: 'neu'"):
        prepare_deferral_dataset(reordered, "label", "e")
    # An expert's answer that is no class of the training split is an error too (not a new class).
    data = splits({"label": ["neg", "pos"], "e": ["neg", "neu"]}, {"label": ["pos"], "e": ["pos"]})
    with pytest.raises(ValueError, match=r"column 'e' of split 'train', row 1: 'neu' is not one of the 2 classes"):
        prepare_deferral_dataset(data, "label", "e")


def test_surrounding_whitespace_is_stripped_and_case_twins_are_refused():
    data = datasets.Dataset.from_dict({"label": ["pos", "pos ", " neg", "neg"], "e": ["neg ", "pos", "pos", "neg"]})
    prepared = prepare_deferral_dataset(data, "label", "e")
    assert prepared.id2label == {0: "neg", 1: "pos"}  # two classes, not four
    assert prepared.dataset["labels"][:] == [1, 1, 0, 0] and prepared.dataset["expert_labels"][:] == [0, 1, 1, 0]
    twins = datasets.Dataset.from_dict({"label": ["pos", "Pos", "neg"], "e": ["pos", "pos", "neg"]})
    with pytest.raises(ValueError, match=r"classes 'Pos' and 'pos', which differ only in case"):
        prepare_deferral_dataset(twins, "label", "e")
    answer = datasets.Dataset.from_dict({"label": ["pos", "neg"], "e": ["POS", "neg"]})
    with pytest.raises(ValueError, match=r"row 0: 'POS' is not one of .*differs from the class 'pos' only in case"):
        prepare_deferral_dataset(answer, "label", "e")
    with pytest.raises(ValueError, match=r"label_names names the classes \['pos'\] more than once"):
        prepare_deferral_dataset(data, "label", "e", label_names=["pos", "neg", "pos "])


@pytest.mark.parametrize("marker", [None, -1, "-1", "", "  ", float("nan")])
def test_one_set_of_missing_markers_in_labels_and_answers(marker):
    assert is_missing(marker)
    strings = isinstance(marker, str) or marker is None
    label = ["a", "b", "a"] if strings else [0, 1, 0]
    data = datasets.Dataset.from_dict({"label": label, "e": [label[0], marker, label[2]]})
    prepared = prepare_deferral_dataset(data, "label", "e", missing_expert="drop")
    assert len(prepared.id2label) == 2  # the marker is never a class
    assert prepared.dataset["labels"][:] == [0, 0]
    data = datasets.Dataset.from_dict({"label": [label[0], marker, label[1]], "e": label})
    with pytest.raises(ValueError, match=r"label column 'label' has no label in rows \[1\] \(None, NaN, -1"):
        prepare_deferral_dataset(data, "label", "e")
    assert not is_missing(0) and not is_missing("0") and not is_missing(False) and not is_missing("n/a")


def test_fewer_than_two_classes_says_which_rows_had_no_label(tmp_path):
    # A CSV whose second class is "NA": pandas reads it as NaN, so only 'yes' is a class. The error used to say "has 1
    # class(es)" and nothing of the rows set aside as missing.
    (tmp_path / "train.csv").write_text("text,label,e\na,yes,yes\nb,NA,yes\nc,yes,NA\nd,NA,yes\n")
    train = datasets.load_dataset("csv", data_files=str(tmp_path / "train.csv"), split="train")
    assert train["label"][:] == ["yes", None, "yes", None]
    with pytest.raises(ValueError, match=re.escape(
            "label column 'label' has 1 class(es) ['yes']; 2 of its 4 rows have no label and were not counted "
            "(rows [1, 3]: None, NaN")) as refusal:
        prepare_deferral_dataset(datasets.DatasetDict(train=train), "label", "e", text_column="text")
    assert "NA, N/A, null and nan" in str(refusal.value)
    numbers = datasets.Dataset.from_dict({"label": [1.0, float("nan"), 1.0], "e": [1, 1, 0]})
    with pytest.raises(ValueError, match=re.escape("has 1 class(es) ['1']; 1 of its 3 rows have no label and were "
                                                   "not counted (rows [1]")):
        prepare_deferral_dataset(numbers, "label", "e")
    with pytest.raises(ValueError, match=re.escape("has 1 class(es) ['yes']; learning to defer needs at least 2.")):
        prepare_deferral_dataset(datasets.Dataset.from_dict({"label": ["yes"] * 3, "e": ["yes"] * 3}), "label", "e")


def test_one_based_integer_labels_make_no_phantom_class():
    data = datasets.Dataset.from_dict({"label": [1, 2, 3, 2], "e": [1, 1, 3, 2]})
    prepared = prepare_deferral_dataset(data, "label", "e")
    assert prepared.id2label == {0: "1", 1: "2", 2: "3"}  # no class "0" that no row has
    assert prepared.dataset["labels"][:] == [0, 1, 2, 1] and prepared.dataset["expert_labels"][:] == [0, 0, 2, 1]
    assert prepared.num_labels == 3
    # With label_names, integer labels are class ids in its order (0-based).
    named = prepare_deferral_dataset(datasets.Dataset.from_dict({"label": [0, 2, 1], "e": [0, 0, 2]}), "label", "e",
                                     label_names=["neg", "neu", "pos"])
    assert named.dataset["labels"][:] == [0, 2, 1] and named.dataset["expert_labels"][:] == [0, 0, 2]


def test_integers_in_one_split_and_digit_strings_in_another_are_one_error_with_the_fix():
    data = splits({"label": [0, 1, 1], "e": [0, 1, 0]}, {"label": ["1", "0"], "e": [1, 0]})
    with pytest.raises(ValueError, match=re.escape("column 'label' of split 'test', row 0: '1' — the column holds "
                                                   "strings, but the classes come from integer labels")
                       + r".*cast_column\('label', datasets.Value\('int64'\)\)"):
        prepare_deferral_dataset(data, "label", "e")
    answers = datasets.Dataset.from_dict({"label": ["neg", "pos"], "e": [0, 1]})
    with pytest.raises(ValueError, match=r"column 'e', row 0: 0 — the column holds integers, but the classes are names"):
        prepare_deferral_dataset(answers, "label", "e")


def test_a_class_named_defer_is_refused_before_any_model():
    data = datasets.Dataset.from_dict({"label": ["defer", "keep"], "e": ["keep", "keep"]})
    with pytest.raises(ValueError, match=r"class named 'defer'.*rename it"):
        prepare_deferral_dataset(data, "label", "e")
    with pytest.raises(ValueError, match=r"id2label has a class named 'defer'"):
        DeferralConfig(feature_size=2, id2label={0: "defer", 1: "keep"})


def test_expert_names_must_be_distinct_and_class_names_too():
    with pytest.raises(ValueError, match=r"expert_names must be distinct.*\['x'\] more than once"):
        DeferralConfig(feature_size=2, num_labels=2, num_experts=2, expert_names=["x", "x"])
    with pytest.raises(ValueError, match=r"id2label must name each class once, got \['a'\]"):
        DeferralConfig(feature_size=2, id2label={0: "a", 1: "a"})
    with pytest.raises(ValueError, match=r"expert named 'classifier', the pipeline's `answered_by`"):
        DeferralConfig(feature_size=2, num_labels=2, num_experts=2, expert_names=["classifier", "x"])
    config = DeferralConfig(feature_size=2, num_labels=2)
    config.expert_names = ["y"]  # set after construction: save_pretrained's validate() refuses it too
    config.num_experts, config.expert_names, config.expert_costs, config.expert_kinds = 2, ["y", "y"], [0, 0], None
    with pytest.raises(ValueError, match="expert_names must be distinct"):
        config.validate_expert_names()


# ---------------------------------------------------------------------------------------------------- label spaces
def three_class_model() -> EncoderForDeferral:
    return EncoderForDeferral(DeferralConfig(feature_size=3, id2label={0: "neg", 1: "neu", 2: "pos"}))


def test_a_split_prepared_on_its_own_is_refused_against_the_models_classes(tmp_path):
    rng = np.random.default_rng(0)
    test = datasets.Dataset.from_dict({"features": rng.normal(size=(4, 3)).tolist(), "label": ["neg", "pos"] * 2,
                                       "e": ["pos", "pos", "neg", "neg"]})
    alone = prepare_deferral_dataset(test.rename_column("features", "f"), "label", "e")
    alone = alone.dataset.add_column("features", test["features"][:])
    assert alone.features["labels"].names == ["neg", "pos"]  # ids 0, 1: "pos" is 1, the model's "neu"
    model = three_class_model()
    args = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match=r"eval_dataset's 'labels' column is a ClassLabel with the classes "
                                         r"\['neg', 'pos'\], but the model's classes .* \['neg', 'neu', 'pos'\].*"
                                         r"label_names=model.config.id2label"):
        DeferralTrainer(model=model, args=args, eval_dataset=alone)
    trainer = DeferralTrainer(model=model, args=args)
    with pytest.raises(ValueError, match="compared by position"):
        trainer.evaluate(alone)
    # Prepared with the model's classes, "pos" is id 2 and the split is accepted.
    matched = prepare_deferral_dataset(test.rename_column("features", "f"), "label", "e",
                                       label_names=model.config.id2label)
    assert matched.dataset["labels"][:] == [0, 2, 0, 2] and matched.dataset["expert_labels"][:] == [2, 2, 0, 0]
    assert matched.id2label == model.config.id2label
    from_label2id = prepare_deferral_dataset(test.rename_column("features", "f"), "label", "e",
                                             label_names=model.config.label2id)
    assert from_label2id.dataset["labels"][:] == [0, 2, 0, 2]
    check_label_names(matched.dataset, model.config, "eval_dataset")
    trainer.evaluate(matched.dataset.add_column("features", test["features"][:]))


def test_default_names_are_checked_by_count_and_unnamed_columns_not_at_all():
    config = DeferralConfig(feature_size=3, num_labels=3)
    same = datasets.Dataset.from_dict({"labels": [0, 1]}, features=datasets.Features(
        {"labels": datasets.ClassLabel(names=["a", "b", "c"])}))
    check_label_names(same, config)
    fewer = same.cast_column("labels", datasets.ClassLabel(names=["a", "b"]))
    with pytest.raises(ValueError, match=r"ClassLabel with the classes \['a', 'b'\].*\['LABEL_0', 'LABEL_1', 'LABEL_2'\]"):
        check_label_names(fewer, config)
    check_label_names(datasets.Dataset.from_dict({"labels": [0, 1]}), config)  # plain ids: nothing to compare


# ---------------------------------------------------------------------------------------------------- messy labels
MESSY = ["pos", "pos ", " pos", "neg", "neg\t", "neu", "Pos", "", "  ", "-1", None]


@settings(max_examples=examples(60), suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(MESSY), min_size=1, max_size=8), st.lists(st.sampled_from(MESSY), max_size=4),
       st.data())
def test_messy_labels_follow_the_rules_or_fail_naming_the_row(train_labels, test_labels, data):
    """Independently of the code: the classes are the stripped, non-missing training labels, sorted; a case twin, a
    missing label, a test label outside them, or fewer than two classes is an error; otherwise every row's class is
    its stripped label."""
    train_experts = [data.draw(st.sampled_from(["pos", "neg", "neu"])) for _ in train_labels]
    test_experts = [data.draw(st.sampled_from(["pos", "neg", "neu"])) for _ in test_labels]
    dataset = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"label": train_labels, "e": train_experts},
                                                                        features=FEATURES)})
    if test_labels:
        dataset["test"] = datasets.Dataset.from_dict({"label": test_labels, "e": test_experts}, features=FEATURES)
    clean = [None if value is None or value.strip() in ("", "-1") else value.strip() for value in train_labels]
    classes = sorted({value for value in clean if value is not None})
    try:
        prepared = prepare_deferral_dataset(dataset, "label", "e")
    except ValueError as error:
        message = str(error)
        folded = {value.casefold() for value in classes}
        test_clean = [None if v is None or v.strip() in ("", "-1") else v.strip() for v in test_labels]
        expected = (len(folded) < len(classes) or len(classes) < 2 or None in clean or None in test_clean
                    or any(v not in classes for v in test_clean if v is not None)
                    or any(e not in classes for e in train_experts + test_experts))
        assert expected, message
        assert "label" in message or "'e'" in message or "classes" in message
        return
    assert list(prepared.id2label.values()) == classes
    assert len({value.casefold() for value in classes}) == len(classes)
    for split, raw in (("train", train_labels), ("test", test_labels)):
        if raw:
            ids = prepared.dataset[split]["labels"][:]
            assert [prepared.id2label[i] for i in ids] == [value.strip() for value in raw]


FEATURES = datasets.Features({"label": datasets.Value("string"), "e": datasets.Value("string")})


def test_docstring_examples_run():
    import hf_defer.data.labels as labels_module

    result = doctest.testmod(labels_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
