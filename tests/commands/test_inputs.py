"""Reading and checking a user's data and flags: each mistake is one message that names the flag or file, the split,
the row and the fix."""

from __future__ import annotations

import doctest
import json

import datasets
import pytest

import hf_defer.commands.evaluate as evaluate_module
import hf_defer.commands.inputs as inputs_module
from hf_defer.commands.arguments import help_group, parse_run_arguments
from hf_defer.commands.cli import _bare_debug
from hf_defer.commands.evaluate import match_expert_columns
from hf_defer.commands.inputs import check_splits, read_table
from hf_defer.commands.predict import parse_expert_costs

BASE = ["--model_name_or_path", "enc", "--train_file", "train.csv", "--expert_column_names", "alice",
        "--output_dir", "out"]


def test_read_table_names_the_flag_and_the_file_of_every_unreadable_input(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("text,label\n")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "ok.txt").write_text("one\n\ntwo\n")
    with pytest.raises(FileNotFoundError, match=r"--input '.*missing.csv' does not exist"):
        read_table(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match=r"--train_file '.*empty.csv' is empty; give a file with a header and data"):
        read_table(str(tmp_path / "empty.csv"), "--train_file")
    with pytest.raises(ValueError, match=r"--input '.*header.csv' holds no data rows \(only a header\?\)"):
        read_table(str(tmp_path / "header.csv"))
    with pytest.raises(ValueError, match=r"--input '.*broken.json' cannot be read as json: "):
        read_table(str(tmp_path / "broken.json"))
    with pytest.raises(ValueError, match="--input must be a csv, json, jsonl, parquet or txt file, got 'x.xlsx'"):
        read_table("x.xlsx")
    assert read_table(str(tmp_path / "ok.txt"))["text"] == ["one", "two"]


def splits(**columns_by_split):
    return {split: datasets.Dataset.from_dict(columns) for split, columns in columns_by_split.items()}


SOURCES = {"train": "--train_file train.csv", "validation": "--validation_file dev.csv", "test": "--test_file t.csv"}
CLASSES = [("--label_column_name", "label"), ("--expert_column_names", "alice")]


def test_check_splits_finds_a_test_file_without_the_text_column_before_training():
    raw = splits(train={"review": ["a", "b"], "label": [0, 1], "alice": [0, 1]},
                 test={"text": ["c"]})  # unlabelled test file (fine) whose text column is named otherwise (not)
    with pytest.raises(ValueError, match=r"--text_column_names 'review' is not a column of split 'test' "
                                         r"\(--test_file t.csv\); its columns are \['text'\]\. Add the column or name"):
        check_splits(raw, SOURCES, {"--text_column_names": "review"}, CLASSES)
    raw["test"] = datasets.Dataset.from_dict({"review": ["c"]})
    check_splits(raw, SOURCES, {"--text_column_names": "review"}, CLASSES)  # unlabelled: predictions only


def test_check_splits_names_the_row_of_an_empty_text_cell():
    raw = splits(train={"review": ["a", "b", None, "  "], "label": [0, 1, 0, 1], "alice": [0, 1, 0, 1]})
    with pytest.raises(ValueError, match=r"--text_column_names 'review' of split 'train' \(--train_file train.csv\), "
                                         r"row 2: the text is empty \(2 such row\(s\)\); fill it in or remove the row"):
        check_splits(raw, SOURCES, {"--text_column_names": "review"}, CLASSES)


def test_check_splits_refuses_class_ids_in_one_file_and_digit_strings_in_another():
    raw = splits(train={"text": ["a", "b"], "label": [0, 1], "alice": [0, 1]},
                 validation={"text": ["c"], "label": ["1"], "alice": [1]})
    with pytest.raises(ValueError, match=r"--label_column_name 'label' holds class ids in split 'train' \(--train_file "
                                         r"train.csv; row 0: 0\) but text in split 'validation' \(--validation_file "
                                         r"dev.csv; row 0: '1'\); write it the same way in every file"):
        check_splits(raw, SOURCES, {"--text_column_names": "text"}, CLASSES)


def test_check_splits_wants_every_class_column_in_a_labelled_split():
    raw = splits(train={"text": ["a"], "label": [0]}, test={"text": ["c"], "label": [1]})
    with pytest.raises(ValueError, match=r"--expert_column_names 'alice' is not a column of split 'train'"):
        check_splits(raw, SOURCES, {"--text_column_names": "text"}, CLASSES)


def test_expert_columns_are_matched_by_name_never_by_position():
    assert match_expert_columns(["bob", "alice"], ["alice", "bob"]) == ["alice", "bob"]
    assert match_expert_columns(None, ["alice", "bob"]) == ["alice", "bob"]
    assert match_expert_columns(["bob=b", "alice=a"], ["alice", "bob"]) == ["a", "b"]
    assert match_expert_columns(["answers"], ["annotator"]) == ["answers"]  # one expert: any one column
    with pytest.raises(ValueError, match=r"--expert_column_names must name one column per expert of the model "
                                         r"\(alice, bob\), matched by name: 'alice,bob' .* or 'alice=<column>,bob="
                                         r"<column>'; got 'col_a,col_b' \(not experts of the model: \['col_a', "):
        match_expert_columns(["col_a", "col_b"], ["alice", "bob"])
    with pytest.raises(ValueError, match="got 'alice'"):
        match_expert_columns(["alice"], ["alice", "bob"])


def test_malformed_expert_costs_name_the_flag_and_the_experts():
    assert parse_expert_costs("0.1, 0.5", ["alice", "bob"]) == [0.1, 0.5]
    for value in ("0.1,abc", "0.1", "0.1,0.2,0.3", "-1,0", "nan,0", "inf,0"):
        with pytest.raises(ValueError, match=r"--expert_costs must be 2 comma-separated non-negative numbers, one per "
                                             r"expert in the model's order \(alice, bob\), e.g. 0.1,0.1; got "):
            parse_expert_costs(value, ["alice", "bob"])


def test_run_flags_carry_over_from_run_classification(tmp_path):
    model_args, data_args, training_args = parse_run_arguments(
        [*BASE, "--text_column_name", "title,body", "--text_column_delimiter", " | ", "--tokenizer_name", "tok",
         "--config_name", "cfg", "--cache_dir", "c", "--model_revision", "v1", "--token", "t", "--trust_remote_code",
         "--preprocessing_num_workers", "2", "--overwrite_cache", "--shuffle_train_dataset", "--train_split_name",
         "tr", "--validation_split_name", "va", "--test_split_name", "te", "--max_seq_length", "64"])
    assert data_args.text_columns == ["title", "body"] and data_args.text_column_delimiter == " | "
    assert (model_args.tokenizer_name, model_args.config_name, model_args.cache_dir, model_args.model_revision,
            model_args.token, model_args.trust_remote_code) == ("tok", "cfg", "c", "v1", "t", True)
    assert (data_args.preprocessing_num_workers, data_args.overwrite_cache, data_args.shuffle_train_dataset) == \
        (2, True, True)
    assert (data_args.train_split_name, data_args.validation_split_name, data_args.test_split_name) == \
        ("tr", "va", "te")
    # a JSON file written for the old flag name still works
    (tmp_path / "flags.json").write_text(json.dumps({"model_name_or_path": "enc", "train_file": "train.csv",
                                                     "expert_column_names": "alice", "output_dir": "out",
                                                     "text_column_name": "review"}))
    assert parse_run_arguments([str(tmp_path / "flags.json")])[1].text_columns == ["review"]


@pytest.mark.parametrize(("value", "parsed"), [("true", True), ("True", True), ("false", None),
                                               ("out/checkpoint-8", "out/checkpoint-8")])
def test_resume_from_checkpoint_true_means_the_newest_complete_checkpoint(value, parsed):
    assert parse_run_arguments([*BASE, "--resume_from_checkpoint", value])[2].resume_from_checkpoint == parsed


def test_run_flag_mistakes_are_errors_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match=r"unrecognized argument: --bogus; `.*--help` lists the flags"):
        parse_run_arguments([*BASE, "--bogus", "1"])
    with pytest.raises(ValueError, match="--max_seq_length must be a positive number of tokens, got 0"):
        parse_run_arguments([*BASE, "--max_seq_length", "0"])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"the flags file '.*bad.json' is not valid JSON"):
        parse_run_arguments([str(tmp_path / "bad.json")])
    with pytest.raises(FileNotFoundError, match=r"the flags file 'nowhere.json' cannot be read"):
        parse_run_arguments(["nowhere.json"])


def test_help_groups_and_bare_debug():
    from hf_defer.commands.arguments import DataTrainingArguments, ModelArguments

    assert help_group(DataTrainingArguments, "expert_column_names") == "essential"  # what --help shows alone
    assert help_group(DataTrainingArguments, "annotator_count_columns") == "deferral"  # a later expert flag too
    assert help_group(ModelArguments, "surrogate") == "deferral" and help_group(ModelArguments, "pooling") == "model"
    assert help_group(DataTrainingArguments, "train_file") == "essential" and help_group(object, "seed") == "training"
    assert help_group(DataTrainingArguments, "text_column_delimiter") == "data"
    assert _bare_debug(["--a", "1", "--debug"]) == (["--a", "1"], True)
    assert _bare_debug(["--debug", "underflow_overflow"]) == (["--debug", "underflow_overflow"], False)


def test_docstring_examples_run():
    for module in (inputs_module, evaluate_module):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted > 0, module


@pytest.mark.parametrize("cell, message", [
    (None, "the value is missing"), (float("nan"), "the value is missing"), ("  ", "the value is missing"),
    ([1], "expected one value (a number, or a category such as a subject), got a list"),
    ({"tier": 1}, "expected one value (a number, or a category such as a subject), got a dict"),
])
def test_streamed_side_features_follow_the_one_rule_naming_column_and_row(cell, message):
    from hf_defer.commands.inputs import side_feature_rows

    for numeric in (True, False):
        chunk = {"tier": ["1", cell, "2"]}
        with pytest.raises(ValueError, match=r"side feature column 'tier', row 11: " + message.replace("(", r"\(")
                           .replace(")", r"\)")):
            side_feature_rows(["a", "b", "c"], chunk, {"tier": numeric}, start=10)


def test_streamed_side_features_are_read_by_what_they_mean():
    from hf_defer.commands.inputs import side_feature_rows

    chunk = {"tier": [1.0, " 2 ", 3], "length": ["412", 7, 0.5]}  # Parquet floats, CSV text, JSON integers
    rows = side_feature_rows(["a", "b", "c"], chunk, {"tier": False, "length": True})
    assert rows == [{"text": "a", "tier": "1", "length": 412.0}, {"text": "b", "tier": "2", "length": 7.0},
                    {"text": "c", "tier": "3", "length": 0.5}]
