"""The flags of the commands: the closest known flag to a mistyped one, the short `--help`, and the flags of
`hf-defer train` remembered from its real parser, so that mistakes are answered before torch is imported.

`hf-defer train` (and `scripts/run_deferral.py`) parse with `HfArgumentParser` over transformers' `TrainingArguments`,
which takes seconds to import. The first run writes what that parser knows ([`TrainFlags`]: every option string and
the field it sets, and the help texts) to hf_defer's cache, under a key made of the parser's sources (their paths,
sizes and modification times: transformers' `training_args.py`, hf_defer's `arguments.py`, `cli.py`,
`promise_flags.py`, `validators.py` and this file), the program's name and the terminal width. Later runs answer
`--help`, `--help-all`, an unknown flag (with the closest known one), an unknown key of a JSON flags file, a data
file that does not exist and an `--output_dir` the run must not write into from that file, before importing torch
([`check_run_flags`]); any other mistake, and every run whose cache is missing or stale, goes to the full parse.
Nothing here reads another package's source.

Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..experts.cache import hf_defer_cache_dir

__all__ = ["COMMAND_OPTIONS", "ESSENTIAL_FLAGS", "HelpAllAction", "PlainDefaultsHelpFormatter", "PlainHelpFormatter",
           "PlainRawDescriptionHelpFormatter", "TrainFlags", "check_run_flags", "closest_flag", "in_flags", "plain_help",
           "short_help", "unknown_flags", "unknown_flags_message"]

ESSENTIAL_FLAGS = ("model_name_or_path", "freeze_encoder", "dataset_name", "train_file", "validation_file", "test_file",
                   "text_column_names", "label_column_name", "expert_column_names", "expert_correct_columns",
                   "missing_expert", "route_only", "default_expert", "max_deferral_rate", "max_seq_length",
                   "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "num_train_epochs",
                   "learning_rate", "per_device_train_batch_size", "push_to_hub")
"""The flags a first run needs, which `--help` shows alone (`--help-all` adds the others, in their groups)."""


class HelpAllAction(argparse.Action):
    """`--help-all`: the parser's full help (`print_help(full=True)`), then exit."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.print_help(full=True)  # type: ignore[call-arg]
        parser.exit()


def plain_help(text: str) -> str:
    """Docstring markup as the plain text a terminal shows: a reference `([`name`])` left out, `[`name`]` and a code
    span `` `x` `` as the bare words (transformers' `TrainingArguments` help uses them too).

    Example:

    ```python
    >>> from hf_defer.commands.flags import plain_help
    >>> plain_help("the router picks ([`build_router_app`]); see [`DeferralConfig`] and `--output_dir`.")
    'the router picks; see DeferralConfig and --output_dir.'

    ```
    """
    text = re.sub(r"\s*\(\[`[^`\]]+`\]\)", "", text)
    return re.sub(r"\[`([^`\]]+)`\]", r"\1", text).replace("`", "")


class PlainHelpFormatter(argparse.HelpFormatter):
    """An argparse formatter whose descriptions and flag help are [`plain_help`]: no docstring markup in `--help`."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_help(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_help(super()._expand_help(action))


class PlainRawDescriptionHelpFormatter(PlainHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """[`PlainHelpFormatter`] that keeps the description's lines as written (for a list of forms)."""


class PlainDefaultsHelpFormatter(PlainHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """[`PlainHelpFormatter`] that adds each flag's default, as `HfArgumentParser`'s formatter does."""


def short_help(parser: argparse.ArgumentParser, titles: Sequence[str]) -> str:
    """The usage, the options and the argument groups named in `titles`, then one line counting the flags of the
    other groups, which `--help-all` lists (the way `git` and `pip` keep their first help short)."""
    formatter = parser._get_formatter()
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    shown = [group for group in parser._action_groups if group.title in titles or group.title == "options"]
    for group in shown:
        formatter.start_section(group.title)
        formatter.add_text(group.description)
        formatter.add_arguments(group._group_actions)
        formatter.end_section()
    hidden = [(group.title, len(group._group_actions)) for group in parser._action_groups
              if group not in shown and group._group_actions]
    formatter.add_text(f"{parser.prog} --help-all lists {sum(n for _, n in hidden)} more flags: "
                       + ", ".join(f"{title} ({n})" for title, n in hidden) + ".")
    return formatter.format_help()


DATA_FILE_FLAGS = ("train_file", "validation_file", "test_file")
COMMAND_OPTIONS = ("-h", "--help", "--help-all", "--json")
"""Options of `hf-defer train` itself, next to the dataclasses' flags."""


def closest_flag(flag: str, known: Iterable[str]) -> str | None:
    """The known long flag closest to `flag` (`difflib`), dashes and underscores alike, or None when none is close.

    Example:

    ```python
    >>> from hf_defer.commands.flags import closest_flag
    >>> closest_flag("--train_fiel", ["--train_file", "--test_file", "--output_dir"])
    '--train_file'

    ```
    """
    candidates: dict[str, str] = {}
    for option in known:  # the first spelling of a flag wins: `--train_file` before `--train-file`
        if option.startswith("--"):
            candidates.setdefault(option.replace("-", "_"), option)
    match = difflib.get_close_matches(flag.split("=", 1)[0].replace("-", "_"), list(candidates), n=1, cutoff=0.6)
    return candidates[match[0]] if match else None


def unknown_flags(argv: Sequence[str], known: Iterable[str]) -> list[str]:
    """The tokens of `argv` that look like flags (`--name`, `--name=value`, `-x`) and are no known option, nor a
    prefix of one (argparse accepts unambiguous prefixes). Negative numbers are values; `--` ends the flags."""
    known = set(known)
    found = []
    for token in argv:
        if token == "--":
            break
        if not token.startswith("-") or token == "-" or _is_number(token):
            continue
        name = token.split("=", 1)[0]
        if name in known or (name.startswith("--") and any(option.startswith(name) for option in known)):
            continue
        found.append(name)
    return found


def unknown_flags_message(unknown: Sequence[str], known: Iterable[str]) -> str:
    """`unrecognized arguments: --train_fiel (did you mean --train_file?)`, one suggestion per flag where one is
    close."""
    known = list(known)
    parts = []
    for flag in unknown:
        suggestion = closest_flag(flag, known) if flag.startswith("-") else None
        parts.append(f"{flag} (did you mean {suggestion}?)" if suggestion else flag)
    return f"unrecognized argument{'s' if len(parts) > 1 else ''}: {', '.join(parts)}"


_KEYWORD = re.compile(r"(?<![\w.-])(?P<name>[A-Za-z_]\w*)=(?P<value>'[^']*'|\"[^\"]*\"|[\w.+-]*\w)")
"""A Python keyword argument in an error message: `missing_expert='drop'`, `max_error=0.05`, `overwrite=True`."""


def in_flags(message: str, flags: Iterable[str]) -> str:
    """`message`, a library error, in the command line's words: each Python keyword argument it names whose flag the
    command has (`--name` among `flags`) written as that flag (`missing_expert='drop'` as `--missing_expert drop`,
    `overwrite=True` as `--overwrite`); the rest is left as it is. The one place `hf-defer` turns the library's advice
    into flags, so that the library's errors keep speaking Python.

    Example:

    ```python
    >>> from hf_defer.commands.flags import in_flags
    >>> in_flags("1 row(s); pass missing_expert='drop' to drop them, or missing_expert='mask'.",
    ...          ["--missing_expert", "--input"])
    '1 row(s); pass --missing_expert drop to drop them, or --missing_expert mask.'
    >>> in_flags("pass overwrite=True, or give a new folder (seed=3 is not a flag here)", ["--overwrite"])
    'pass --overwrite, or give a new folder (seed=3 is not a flag here)'

    ```
    """
    known = set(flags)

    def flag(match: re.Match) -> str:
        name, value = match["name"], match["value"]
        if f"--{name}" not in known:
            return match[0]
        if value[:1] in "'\"":
            value = shlex.quote(value[1:-1])
        return f"--{name}" if value == "True" else f"--{name} {value}"

    return _KEYWORD.sub(flag, message)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True

@dataclass(frozen=True)
class TrainFlags:
    """What the parser of `hf-defer train` knows, as saved after a full parse: option string -> field name
    (`options`), and the texts of `--help` and `--help-all`."""

    options: dict[str, str]
    short_help: str
    full_help: str

    @classmethod
    def from_parser(cls, parser: argparse.ArgumentParser) -> TrainFlags:
        options = {option: action.dest for option, action in parser._option_string_actions.items()}
        return cls(options, parser.format_help(), parser.format_help(full=True))  # type: ignore[call-arg]

    @staticmethod
    def path(prog: str) -> Path | None:
        """The cache file for `prog` and the parser's sources as installed now; None when a source is not found."""
        import importlib.util

        spec = importlib.util.find_spec("transformers")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return None
        here = Path(__file__).resolve().parent
        sources = [Path(next(iter(spec.submodule_search_locations))) / "training_args.py",
                   here / "arguments.py", here / "cli.py", here / "promise_flags.py", Path(__file__).resolve(),
                   here.parent / "modeling" / "validators.py"]  # the choices some flags take
        key = hashlib.sha256()
        try:
            for source in sources:
                stat = source.stat()
                key.update(f"{source}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
        except OSError:
            return None
        key.update(f"{sys.version}:{prog}:{shutil.get_terminal_size().columns}".encode())
        return hf_defer_cache_dir() / "train_flags" / f"{key.hexdigest()[:32]}.json"

    @classmethod
    def load(cls, prog: str) -> TrainFlags | None:
        """The flags a full parse saved for `prog` with the sources as they are now, or None (first run, a source
        changed, an unreadable file)."""
        path = cls.path(prog)
        try:
            with open(path, encoding="utf-8") as handle:  # type: ignore[arg-type]
                return cls(**json.load(handle))
        except (OSError, TypeError, ValueError):
            return None

    def save(self, prog: str) -> None:
        """Writes these flags for `prog` (whole or not at all; a cache that cannot be written is skipped)."""
        path = self.path(prog)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False,
                                             suffix=".tmp") as handle:
                json.dump(asdict(self), handle)
            os.replace(handle.name, path)
        except OSError:
            return


def _flag_values(argv: Sequence[str], options: dict[str, str]) -> dict[str, str]:
    """The last value given to each field in `argv` (`--flag value` or `--flag=value`), by field name."""
    values = {}
    for index, token in enumerate(argv):
        name, equals, value = token.partition("=")
        field = options.get(name)
        if field is None:
            continue
        if equals:
            values[field] = value
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            values[field] = argv[index + 1]
        else:
            values[field] = ""
    return values


def _missing_file(flag: str, path: str) -> str | None:
    if not path or "://" in path or any(char in path for char in "*?[") or os.path.isfile(path):
        return None
    return f"--{flag} {path!r} does not exist" + (" (it is a folder)." if os.path.isdir(path) else ".")


def check_run_flags(argv: Sequence[str], flags: TrainFlags,
                    check_output_dir: Callable[[str], None] | None = None) -> str | None:
    """The first mistake in the flags of a run that the saved `flags` show, as one line, or None: unknown flags (or
    keys of a JSON flags file), each with the closest known one, then data files that do not exist; then, unless
    `--overwrite_output_dir` is given, `check_output_dir(output_dir)` runs (it raises on a folder the run must not
    write into). The full parse checks everything again, and the values.

    Example:

    ```python
    >>> from hf_defer.commands.flags import TrainFlags, check_run_flags
    >>> flags = TrainFlags({"--model_name_or_path": "model_name_or_path", "--train_file": "train_file",
    ...                     "--test_file": "test_file", "--output_dir": "output_dir"}, "", "")
    >>> check_run_flags(["--model_name_or_path", "x", "--train_fiel", "train.csv", "--output_dir", "o"], flags)
    'unrecognized argument: --train_fiel (did you mean --train_file?)'

    ```
    """
    options = {**flags.options, **{option: option.lstrip("-").replace("-", "_") for option in COMMAND_OPTIONS}}
    if len(argv) == 1 and argv[0].endswith(".json"):
        try:
            with open(argv[0], encoding="utf-8") as handle:
                values = json.load(handle)
        except (OSError, ValueError):
            return None  # the full parse says why, with the file's name
        if not isinstance(values, dict):
            return None
        fields = set(options.values()) | {"text_column_name"}
        unknown = [key for key in values if key not in fields]
        if unknown:
            hints = [f"{key!r}" + (f" (did you mean {hint[2:]!r}?)" if (hint := closest_flag(f"--{key}", options))
                                   else "") for key in unknown]
            return f"the flags file {argv[0]!r} has unknown keys: {', '.join(hints)}"
        given = {key: value if isinstance(value, str) else "" for key, value in values.items()}
    else:
        unknown = unknown_flags(argv, options)
        if unknown:
            return unknown_flags_message(unknown, options)
        if any(token in ("-h", "--help", "--help-all") for token in argv):
            return None
        given = _flag_values(argv, options)
    for flag in DATA_FILE_FLAGS:
        problem = _missing_file(flag, given.get(flag, ""))
        if problem:
            return problem
    if check_output_dir is not None and given.get("output_dir") and "overwrite_output_dir" not in given:
        check_output_dir(given["output_dir"])
    return None
