"""The `hf-defer` command (also `python -m hf_defer`): `annotations`, `train`, `predict`, `evaluate`, `calibrate`.

- `hf-defer annotations --annotations_file FILE ...`: a labelling tool's long export (one row per item, annotator and
  answer) as the wide CSV that `hf-defer train` reads, a target aggregated from the annotators; prints the flags.
- `hf-defer train ...`: the flags of `scripts/run_deferral.py` (see [`run_deferral`]), or one JSON file of them;
  `--json` prints only the run's final JSON on stdout (the Trainer's tables go to stderr).
- `hf-defer predict --model PATH_OR_ID --input FILE`: the deferral pipeline's decision for every row of a file,
  written as CSV, JSON Lines or Parquet (`predictions.csv` by default).
- `hf-defer evaluate --model PATH_OR_ID --input FILE`: the deferral metrics of a saved model on a labelled file.
- `hf-defer serve --router FOLDER --model NAME=URL ...` / `--model FOLDER`: an HTTP endpoint (`hf_defer.commands.serve`;
  `pip install 'hf-defer[serve]'`).
- `hf-defer export --onnx [--quantize int8] MODEL OUT`: a saved model as an ONNX folder for `--backend onnx` of
  `predict` and `serve` (`pip install 'hf-defer[onnx]'`).
- `hf-defer calibrate --model FOLDER --input FILE --max_error 0.05 --confidence 0.9`: the deferral threshold that
  keeps a budget, an error target or a cost budget on new inputs with that confidence, saved with the model.
- `hf-defer review push|pull ...`: the review loop with Label Studio (`hf_defer.commands.review`; `pip install
  'hf-defer[review]'`).

Importing this module (and the lazy `hf_defer` package above it) loads neither torch nor transformers: `hf-defer
--help`, `--version`, a mistyped command or flag (named with the closest known one) answer at once, and so do `train
--help` and `train`'s mistyped flags, missing data files and refused `--output_dir` once a first `train` has saved
its parser's flags ([`hf_defer.commands.flags.TrainFlags`]). A command imports what it needs when it runs. A mistake (a missing file, a wrong flag value, data that does not fit)
ends with one line on stderr that names the flag and the fix, and exit status 2; `--debug` shows the traceback.
A new command is one more [`Command`] in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..modeling.validators import MISSING_EXPERT_MODES  # standard library only
from .flags import TrainFlags, check_run_flags, in_flags, unknown_flags, unknown_flags_message
from .promise_flags import add_promise_flags  # standard library only
from .progress import quiet_progress_bars_unless_terminal

__all__ = ["COMMANDS", "Command", "build_parser", "main", "run_script", "run_train", "train_parser"]

PROG = "hf-defer"
USER_ERRORS = (ValueError, OSError, ImportError)
"""Exceptions that mean the input or the flags are wrong (not hf_defer): one line and exit status 2."""


class OneLineErrorParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one line, `<prog>: error: <what> (see `<prog> --help`)`, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class Command(NamedTuple):
    """One subcommand: its one-line help, its flags (`None`: the command parses its own, as `train` does with
    `HfArgumentParser`) and what runs it, a `"module:function"` under `hf_defer.commands`, imported when it runs."""

    name: str
    help: str
    run: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


def _input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Saved deferral model: a local folder or a Hub id.")
    parser.add_argument("--input", required=True, help="csv, json, jsonl or parquet file (txt: one text per line).")
    parser.add_argument("--text_column_names", "--text_column_name", dest="text_column_names", default=None,
                        help="Text column; several, comma-separated, are joined with --text_column_delimiter "
                             "(default: 'text').")
    parser.add_argument("--text_column_delimiter", default=" ", help="Joins several text columns (default: a space).")
    parser.add_argument("--text_pair_column_name", default=None, help="Second text of a text pair.")
    parser.add_argument("--image_column_name", default=None, help="Image column (paths or images), vision models.")
    parser.add_argument("--batch_size", type=int, default=32, help="Inputs per forward pass (default: 32).")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Run the code saved with --model instead of the installed hf_defer.")


def _predict_arguments(parser: argparse.ArgumentParser) -> None:
    _input_arguments(parser)
    parser.add_argument("--output", default="predictions.csv",
                        help="File to write: .csv, .jsonl (or .json) or .parquet (default: predictions.csv).")
    parser.add_argument("--overwrite", action="store_true", help="Replace --output if it exists.")
    parser.add_argument("--id_column_name", default=None,
                        help="Column of the input's own ids, copied into the CSV (default: 'id' when the input has "
                             "one, else the row number as 'row').")
    parser.add_argument("--copy_columns", default=None,
                        help="Comma-separated input columns copied into the CSV next to the decisions.")
    parser.add_argument("--expert_costs", default=None,
                        help="Comma-separated cost of asking each expert, in the model's expert order (default: the "
                             "costs saved with the model).")
    parser.add_argument("--defer_threshold", type=float, default=None,
                        help="Deferral margin (default: the calibrated one saved with the model).")
    parser.add_argument("--features_column_name", default=None,
                        help="Head-only models: the column of feature vectors (lists; JSON lists in a CSV; default: "
                             "'features').")
    parser.add_argument("--resume", action="store_true",
                        help="Continue the .csv/.jsonl --output that a stopped run left, after its last whole row.")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"],
                        help="onnx: run --model, a folder of hf-defer export --onnx, with ONNX Runtime on the CPU "
                             "(pip install 'hf-defer[onnx]'; default: torch).")
    parser.add_argument("--num_processes", type=int, default=1,
                        help="Split the input between N processes (one GPU each when there are GPUs) under "
                             "accelerate launch; the output is the one-process output.")


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="Folder of a saved deferral or route-only model.")
    parser.add_argument("output", metavar="OUT", help="Folder to write (model.onnx, config.json, the tokenizer).")
    parser.add_argument("--onnx", action="store_true", help="Export to ONNX (needs pip install 'hf-defer[onnx]').")
    parser.add_argument("--quantize", default=None, choices=["int8"],
                        help="int8: dynamic quantization (int8 weights) for CPU throughput. The float32 graph is kept "
                             "and scores again the inputs whose int8 decision lies near the boundary "
                             "(--fallback_tolerance); the pipeline's outputs say which graph scored each input "
                             "(scored_by). Worth it where few inputs lie near the boundary (a router); without "
                             "--quantize, float32 decides as PyTorch.")
    parser.add_argument("--fallback_tolerance", type=float, default=None,
                        help="With --quantize int8: the decision gap (probability) below which an input is scored "
                             "again in float32 (default 0.05, measured on HateSpeech and MMLU: an empirical "
                             "tolerance, not a guarantee); 0: int8 alone, faster, a few %% of decisions differ.")
    parser.add_argument("--encoder", default=None,
                        help="For a head-only model trained on sentence embeddings: the sentence encoder to put it on, "
                             "so that the exported model reads text.")
    parser.add_argument("--overwrite", action="store_true", help="Replace the files of an existing OUT.")


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    _input_arguments(parser)
    parser.add_argument("--label_column_name", default="label", help="Column of the true class (names or ids).")
    parser.add_argument("--expert_column_names", default=None,
                        help="The experts' answer columns, matched to the model's experts by name: 'alice,bob' "
                             "(columns named as the experts, any order) or 'alice=col_a,bob=col_b' (default: "
                             "columns named as the model's experts).")
    parser.add_argument("--expert_correct_columns", default=None,
                        help="Route-only models: each expert's correctness (0/1, booleans) or score in [0, 1], "
                             "matched by name as --expert_column_names (default: columns named as the experts); no "
                             "label column.")
    parser.add_argument("--missing_expert", default="error", choices=MISSING_EXPERT_MODES,
                        help="What to do with a missing annotation (default: error; mask: keep the row; the "
                             "decisions are the model's all the same, and a deferral to that expert there is counted "
                             "as unscored_deferrals, not scored).")
    parser.add_argument("--output", default=None, help="Also write the metrics to this JSON file.")
    parser.add_argument("--overwrite", action="store_true", help="Replace --output if it exists.")


def _calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    _evaluate_arguments(parser)  # --output: the summary (threshold, guarantee) as JSON
    add_promise_flags(parser)  # --max_deferral_rate (0.1 when no other promise is given), --confidence, ...
    add_promise_flags(parser, ["guarantee"])
    parser.add_argument("--unlabeled_file", default=None,
                        help="With --max_error: more inputs from the same distribution, without labels (the input "
                             "columns only): the prediction-powered test spends them and the model's own estimates "
                             "on the target (--guarantee expected: they set the most deferral it may use).")
    parser.add_argument("--expert_costs", default=None,
                        help="Comma-separated cost of asking each expert, in the model's order (default: the saved "
                             "costs).")
    parser.add_argument("--output_dir", default=None,
                        help="Save the calibrated model here (default: the --model folder itself, with --overwrite).")


def _annotations_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--annotations_file", required=True,
                        help="A labelling tool's export, one row per (item, annotator, answer): csv, json, jsonl or "
                             "parquet.")
    parser.add_argument("--item_column", required=True, help="Column of the item ids (one output row per item).")
    parser.add_argument("--annotator_column", required=True, help="Column of the annotator ids (one column each).")
    parser.add_argument("--answer_column", required=True, help="Column of the answers (class names or ids).")
    parser.add_argument("--items_file", default=None,
                        help="One row per item (the text...), merged on --item_column; every annotated item must be "
                             "there, and its items without any answer are dropped (no target).")
    parser.add_argument("--keep_columns", default=None,
                        help="Comma-separated item-level columns of --annotations_file to carry over (e.g. text).")
    parser.add_argument("--duplicates", default="error", choices=["error", "first", "last", "majority"],
                        help="One annotator answering one item twice: an error (default), or keep their first, last "
                             "or most frequent answer.")
    parser.add_argument("--method", default="majority", choices=["majority", "leave_one_out", "dawid_skene"],
                        help="The target: the annotators' majority (default), Dawid-Skene (pip install "
                             "'hf-defer[crowd]'), or leave_one_out: the majority, and each annotator's column holds "
                             "their correctness against the others' majority (empty where the others tie), their "
                             "answers moving to <annotator>_answer (train with --expert_correct_columns).")
    parser.add_argument("--label_column_name", default="labels", help="Name of the target column (default: labels).")
    parser.add_argument("--keep_tied", action="store_true",
                        help="Keep tied targets, empty, with <label>_tied (default: drop them; hf-defer train needs "
                             "a label on every row).")
    parser.add_argument("--output", default="wide.csv", help="CSV to write (default: wide.csv).")
    parser.add_argument("--overwrite", action="store_true", help="Replace --output if it exists.")


def _monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """`monitor`: see `hf_defer.commands.monitor`."""
    parser.add_argument("--model", required=True, help="The calibrated model (folder or Hub id): its promises.")
    parser.add_argument("--log", required=True, help="The decision log, in decision order: hf-defer predict's output.")
    parser.add_argument("--labels", default=None, help="True labels of some rows (e.g. hf-defer review pull's "
                        "answers.csv): every deferred row, and kept rows drawn at random (--audit_rate).")
    parser.add_argument("--audit_rate", type=float, default=None,
                        help="The chance each kept row had to be drawn for a label (default: 0, deferred rows only).")
    parser.add_argument("--confidence", type=float, default=None,
                        help="1 - the false-alarm probability of all alarms together (default: the guarantee's).")
    parser.add_argument("--id_column", default=None, help="The log's id column (default: id, row or item).")
    parser.add_argument("--labels_id_column", default=None, help="The labels' id column (default: item, id or row).")
    parser.add_argument("--label_column", default=None, help="The labels' column (default: label, labels or answer).")
    parser.add_argument("--expert_answer_column", default=None,
                        help="The expert's own answer on deferred rows (default: the label is the expert's answer).")
    parser.add_argument("--reference_log", default=None,
                        help="Recalibrate the label-free estimate first: the decision log of the model on labelled "
                             "reference inputs (e.g. hf-defer predict on the calibration file), with --reference_labels.")
    parser.add_argument("--reference_labels", default=None,
                        help="The reference rows' true labels, matched by id (and, for the deferred rows, the "
                             "experts' answers: columns named as the experts).")
    parser.add_argument("--reference_id_column", default=None,
                        help="The reference labels' id column (default: id, item or row).")
    parser.add_argument("--reference_label_column", default=None,
                        help="The reference labels' column (default: label, labels or answer).")
    parser.add_argument("--reference_expert_columns", default=None,
                        help="The experts' answer columns of --reference_labels, matched by name: 'alice,bob' or "
                             "'alice=col_a,bob=col_b' (default: columns named as the model's experts).")
    parser.add_argument("--output", default=None, help="Also write the state as JSON to this file.")
    parser.add_argument("--overwrite", action="store_true", help="Replace --output if it exists.")
    parser.add_argument("--fail_on_alarm", action="store_true", help="Exit with status 1 when an alarm is raised.")


COMMANDS: dict[str, Command] = {command.name: command for command in (
    Command("annotations", "a labelling tool's long export (item, annotator, answer) as the wide CSV that train reads",
            "hf_defer.commands.annotations:run_annotations", _annotations_arguments),
    Command("train", "train, evaluate, calibrate and save a deferral model (the flags of scripts/run_deferral.py)",
            "hf_defer.commands.cli:run_train"),
    Command("predict", "decisions of a saved deferral model for every row of a file, as CSV, JSON Lines or Parquet",
            "hf_defer.commands.predict:run_predict", _predict_arguments),
    Command("evaluate", "deferral metrics of a saved model on a labelled file",
            "hf_defer.commands.evaluate:run_evaluate", _evaluate_arguments),
    Command("serve", "a router behind an OpenAI-compatible endpoint, or a deferral model behind /v1/decide",
            "hf_defer.commands.serve:run_serve"),
    Command("export", "a saved deferral model as an ONNX folder for --backend onnx (ONNX Runtime on CPUs)",
            "hf_defer.commands.export:run_export", _export_arguments),
    Command("calibrate", "set a saved model's deferral threshold on a calibration file, with a stated confidence",
            "hf_defer.commands.calibrate:run_calibrate", _calibrate_arguments),
    Command("monitor", "check a decision log (and labels) against the model's certified promises, with an alarm",
            "hf_defer.commands.monitor:run_monitor", _monitor_arguments),
    # named here as a string: label-studio-sdk is imported only when `hf-defer review` runs
    Command("review", "send deferred inputs to Label Studio reviewers (push) and their answers back (pull)",
            "hf_defer.commands.review:main"),
)}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hf-defer")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for (`importlib.metadata` takes a tenth of a second)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{PROG} {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The `hf-defer` parser: `--version`, `--debug` and one subparser per command of `COMMANDS`."""
    parser = OneLineErrorParser(
        prog=PROG, description="Learning to defer on the Hugging Face stack: train a model that answers or hands an "
        "input to the expert more likely to be right, and use it on files.",
        epilog=f"{PROG} <command> --help lists the flags of a command.")
    parser.add_argument("--version", action=_VersionAction, help="show the version of hf_defer and exit")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="{" + ",".join(COMMANDS) + "}",
                                     parser_class=OneLineErrorParser)
    for command in COMMANDS.values():
        sub = commands.add_parser(command.name, help=command.help, description=command.help,
                                  add_help=command.add_arguments is not None)
        if command.add_arguments is not None:
            command.add_arguments(sub)
            sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an error")
    return parser


def _resolve(target: str) -> Callable[..., int]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def _bare_debug(argv: list[str]) -> tuple[list[str], bool]:
    """`argv` without a bare `--debug` (one not followed by a value: `TrainingArguments` has a `--debug MODE`)."""
    kept, found = [], False
    for index, arg in enumerate(argv):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if arg == "--debug" and (following is None or following.startswith("-")):
            found = True
        else:
            kept.append(arg)
    return kept, found


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _in_flags(message: str, prog: str) -> str:
    """`message` with the Python keyword arguments it names written as the flags of the command `prog` runs
    ([`flags.in_flags`]: `missing_expert='drop'` as `--missing_expert drop`)."""
    name = prog.split()[-1]
    command = COMMANDS.get(name)
    if command is not None and command.add_arguments is not None:
        sub = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
        flags = list(sub.choices[name]._option_string_actions)
    elif name == "train" or (command is None and prog == name):  # train, scripts/run_deferral.py: the run's flags
        saved = TrainFlags.load(prog)  # saved by the run's own full parse, which came before any library error
        flags = list(saved.options if saved is not None else train_parser(prog)._option_string_actions)
    else:  # review's own parsers say their errors themselves
        return message
    return in_flags(message, flags)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hf-defer` and `python -m hf_defer`; returns the exit status (0 after `--help`, 2 after a
    mistake).

    Example:

    ```python
    >>> from hf_defer.commands import main
    >>> main(["--version"])
    hf-defer ...
    0
    >>> main(["no-such-command"])  # argparse writes the usage and the error to stderr
    2

    ```
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except SystemExit as exit:  # argparse's --help, --version and usage errors
        return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 2)


def _main(argv: list[str]) -> int:
    parser = build_parser()
    position = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), None)
    if position is None:
        if any(arg in ("-h", "--help", "--version") for arg in argv):
            parser.parse_args(argv)  # prints and exits 0
        parser.print_usage(sys.stderr)
        parser.error("name a command: " + ", ".join(COMMANDS))
    command = COMMANDS.get(argv[position])
    if command is None:
        parser.parse_args(argv[:position + 1])  # "invalid choice" and exit 2
    rest = argv[position + 1:]
    if command.add_arguments is None:  # the command parses its own flags
        args = parser.parse_args(argv[:position + 1])
        rest, bare_debug = _bare_debug(rest)
        debug = args.debug or bare_debug
        call: Callable[[], int] = lambda: _resolve(command.run)(rest)  # noqa: E731
    else:
        sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices[
            command.name]
        unknown = unknown_flags(rest, sub._option_string_actions)
        if unknown:  # before the missing-flag errors argparse gives first: the mistyped flag is the news
            sub.error(unknown_flags_message(unknown, sub._option_string_actions))
        args = parser.parse_args(argv)
        debug = args.debug
        call = lambda: _resolve(command.run)(args)  # noqa: E731
    return _guarded(call, f"{PROG} {command.name}", debug)


def _guarded(call: Callable[[], int], prog: str, debug: bool) -> int:
    """`call()`, a user's mistake ([`USER_ERRORS`]) shown as one line and exit status 2 (raised with `debug`)."""
    quiet_progress_bars_unless_terminal()  # no progress bars in a log file
    try:
        return call()
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"{prog}: error: {_in_flags(_one_line(error), prog)} (--debug shows the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT (a run's record says so too)
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def run_script(argv: Sequence[str], prog: str) -> int:
    """`scripts/run_deferral.py FLAGS`: `hf-defer train` under the script's name, its mistakes answered the same way
    (one line naming the flag, exit status 2; a bare `--debug` shows the traceback)."""
    rest, debug = _bare_debug(list(argv))
    return _guarded(lambda: run_train(rest, prog=prog), prog, debug)


def train_parser(prog: str = f"{PROG} train") -> argparse.ArgumentParser:
    """The parser of `hf-defer train` (imports transformers): `build_run_parser`'s, with `--json`."""
    from .arguments import build_run_parser

    parser = build_run_parser(prog=prog)
    group = parser.add_argument_group("command")
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print only the run's final JSON on stdout (everything else goes to stderr); a bare "
                            "--debug (no value, unlike TrainingArguments' --debug MODE) shows the traceback of an error")
    return parser


def run_train(argv: list[str], prog: str = f"{PROG} train") -> int:
    """`hf-defer train [--json] FLAGS | CONFIG.json`: [`run_deferral`] with the flags of `scripts/run_deferral.py`.
    The run's final JSON goes to `<output_dir>/hf_defer_run.json`; with `--json` it is all that stdout gets.

    Once a run has saved its parser's flags ([`TrainFlags`]), `--help`, `--help-all`, unknown flags (with the closest
    known one), missing data files and an `--output_dir` holding files no hf_defer run or save wrote are answered
    before torch and transformers are imported; the full parse checks the rest."""
    json_only = "--json" in argv
    argv = [arg for arg in argv if arg != "--json"]
    saved = TrainFlags.load(prog)
    if saved is not None:
        from .outputs import OutputFolder  # standard library only

        problem = check_run_flags(argv, saved, check_output_dir=lambda path: OutputFolder(path).check())
        if problem:
            print(f"{prog}: error: {problem} (see `{prog} --help`)", file=sys.stderr)
            return 2
        if "--help-all" in argv or any(arg in ("-h", "--help") for arg in argv):
            print(saved.full_help if "--help-all" in argv else saved.short_help, end="")
            return 0
    from .arguments import parse_run_arguments

    parser = train_parser(prog)
    if saved is None:
        TrainFlags.from_parser(parser).save(prog)
    redirect = contextlib.redirect_stdout(sys.stderr) if json_only else contextlib.nullcontext()
    with redirect:
        model_args, data_args, training_args = parse_run_arguments(argv, parser=parser)
        from .run import run_deferral

        run_deferral(model_args, data_args, training_args)
    if json_only and training_args.process_index == 0:
        import json
        from pathlib import Path

        from .outputs import RUN_SUMMARY

        summary = json.loads((Path(training_args.output_dir) / RUN_SUMMARY).read_text(encoding="utf-8"))
        print(json.dumps(summary, indent=2))
    return 0


def __getattr__(name: str) -> Any:
    """`predict_file`, `evaluate_file` and `read_table` live in their own modules; imported here on first use."""
    if name in ("predict_file", "read_table"):
        return getattr(importlib.import_module("hf_defer.commands.predict"), name)
    if name == "evaluate_file":
        return getattr(importlib.import_module("hf_defer.commands.evaluate"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # `accelerate launch -m hf_defer.commands.cli predict ...`
    raise SystemExit(main())
