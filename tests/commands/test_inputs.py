"""Reading and checking a user's data and flags: each mistake is one message that names the flag or file, the split,
the row and the fix."""

from __future__ import annotations

import doctest
import json
import os

import datasets
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    with pytest.raises(ValueError, match=r"--input '.*broken.json', line 1: not valid JSON"):
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


def _readers(path):
    """What every command reads a user's file with: the whole table (read_table) and the stream (predict)."""
    from hf_defer.commands.inputs import TableStream

    return {"read_table": lambda: read_table(str(path)),
            "TableStream": lambda: [row for chunk in TableStream(str(path), chunk_size=2) for row in chunk["text"]]}


def test_a_long_cell_and_a_byte_order_mark_are_read_as_the_data(tmp_path):
    long_text = "word " * 60_000  # 300 KB in one CSV cell: over the csv module's default 128 KiB limit
    files = {"long.csv": ("id,text\n1,\"" + long_text + "\"\n2,short\n").encode(),
             "bom.csv": "\ufeffid,text\n1,first\n2,second\n".encode(),  # Excel's "CSV UTF-8"
             "bom.jsonl": "\ufeff{\"id\": 1, \"text\": \"first\"}\n{\"id\": 2, \"text\": \"second\"}\n".encode(),
             "bom.txt": "\ufefffirst\nsecond\n".encode()}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        want = [long_text, "short"] if name == "long.csv" else ["first", "second"]
        for reader, read in _readers(tmp_path / name).items():
            table = read()
            texts = table["text"][:] if reader == "read_table" else table
            assert texts == want, (name, reader)
            if reader == "read_table" and name.endswith(".csv"):
                assert table.column_names == ["id", "text"]  # not "\ufeffid"


@pytest.mark.parametrize("name, content, line, words", [
    ("bad.jsonl", b'{"text": "a"}\n{"text": "b"}\n{text: c}\n{"text": "d"}\n', 3, "not valid JSON"),
    ("list.jsonl", b'{"text": "a"}\n["b"]\n', 2, "a JSON list, not an object"),
    ("doc.json", b'[{"text": "a"},\n {"text": "b"} {"text": "c"}]\n', 2, "not valid JSON"),
    ("pretty.json", b'{\n "text": ["a", "b"],\n "id": [1 2]\n}\n', 3, "not valid JSON (Expecting ',' delimiter)"),
    ("latin1.csv", b"id,text\n1,ok\n2,caf\xe9\n", 3, "not UTF-8 text (byte 0xe9 at column 6)"),
    ("latin1.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', 2, "not UTF-8 text (byte 0xe9"),
    ("latin1.txt", b"ok\ncaf\xe9\n", 2, "not UTF-8 text (byte 0xe9"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, name, content, line, words):
    (tmp_path / name).write_bytes(content)
    for reader, read in _readers(tmp_path / name).items():
        with pytest.raises(ValueError) as refused:
            read()
        message = str(refused.value)
        assert f"--input '{tmp_path / name}', line {line}: {words}" in message, (reader, message)


@given(st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x00,\"\x1c\x1d\x1e\x85\u2028\u2029"),
                        min_size=1, max_size=8).filter(str.strip), min_size=1, max_size=12),
       st.data())
def test_the_first_non_utf8_line_is_the_one_named(texts, data):
    """Any CSV of UTF-8 lines with one byte that is never UTF-8 (0xff) put into one of them: the error names that line
    (the header is line 1), whatever the characters around it."""
    import tempfile

    bad = data.draw(st.integers(0, len(texts) - 1))
    lines = ["text".encode()] + [text.encode() for text in texts]
    lines[bad + 1] += b"\xff"
    path = os.path.join(tempfile.mkdtemp(), "data.csv")
    with open(path, "wb") as handle:
        handle.write(b"\n".join(lines) + b"\n")
    from hf_defer.commands.inputs import scan_text_file

    with pytest.raises(ValueError, match=rf"line {bad + 2}: not UTF-8 text \(byte 0xff"):
        scan_text_file(path, "--input", "csv")


def test_the_command_line_says_which_file_and_line_in_one_line(tmp_path, capsys):
    from hf_defer.commands.cli import main

    (tmp_path / "in.jsonl").write_bytes(b'{"text": "a"}\n{"text": "b",}\n')
    capsys.readouterr()
    assert main(["predict", "--model", str(tmp_path / "no-model"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--input '{tmp_path / 'in.jsonl'}', line 2: not valid JSON" in err, err
