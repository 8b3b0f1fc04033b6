"""Mistakes in the flags, found before anything heavy is imported: unknown flags (with the closest known one) and
missing data files.

Standard library only, and no hf_defer import: `hf-defer train` runs these checks before torch, transformers and
datasets are imported (seconds), so that a mistyped flag or a missing file is answered at once. The flags of a run are
read from the source of the argument dataclasses ([`run_options`]): `ModelArguments` and `DataTrainingArguments` in
`hf_defer/commands/arguments.py`, `TrainingArguments` in the installed transformers, with the option strings
`HfArgumentParser` gives them. The full parse still runs afterwards, so anything missed here is reported there.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.util
import json
import os
import re
import shlex
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ESSENTIAL_FLAGS", "HelpAllAction", "PlainHelpFormatter", "PlainRawDescriptionHelpFormatter",
           "check_run_flags", "closest_flag", "in_flags", "plain_help", "run_options", "short_help", "unknown_flags",
           "unknown_flags_message"]

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
    >>> from hf_defer.commands.flag_check import plain_help
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
    formatter.add_text(f"`{parser.prog} --help-all` lists {sum(n for _, n in hidden)} more flags: "
                       + ", ".join(f"{title} ({n})" for title, n in hidden) + ".")
    return formatter.format_help()


DATA_FILE_FLAGS = ("train_file", "validation_file", "test_file")
COMMAND_OPTIONS = ("-h", "--help", "--help-all", "--json")
"""Options of `hf-defer train` itself, next to the dataclasses' flags."""


def closest_flag(flag: str, known: Iterable[str]) -> str | None:
    """The known long flag closest to `flag` (`difflib`), dashes and underscores alike, or None when none is close.

    Example:

    ```python
    >>> from hf_defer.commands.flag_check import closest_flag
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
    >>> from hf_defer.commands.flag_check import in_flags
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


def _dataclass_options(source: Path, class_name: str) -> dict[str, str]:
    """Option string -> field name for the fields of the dataclass `class_name` in `source`, as `HfArgumentParser`
    names them: `--name`, `--name-with-dashes`, the `aliases` of the field's metadata and, for booleans,
    `--no_name` / `--no-name`."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    node = next(item for item in tree.body if isinstance(item, ast.ClassDef) and item.name == class_name)
    options: dict[str, str] = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        annotation, name = ast.unparse(item.annotation), item.target.id
        keywords = {kw.arg: kw.value for kw in item.value.keywords} if isinstance(item.value, ast.Call) else {}
        if "ClassVar" in annotation or (isinstance(keywords.get("init"), ast.Constant)
                                        and keywords["init"].value is False):
            continue
        names = [name] + (["no_" + name] if "bool" in annotation else [])
        for each in names:
            options[f"--{each}"] = options[f"--{each.replace('_', '-')}"] = name
        metadata = keywords.get("metadata")
        if isinstance(metadata, ast.Dict):
            for key, value in zip(metadata.keys, metadata.values):
                if isinstance(key, ast.Constant) and key.value == "aliases":
                    aliases = ast.literal_eval(value)
                    for alias in [aliases] if isinstance(aliases, str) else aliases:
                        options[alias] = name
    return options


def run_options() -> dict[str, str] | None:
    """Option string -> field name for every flag of `hf-defer train` / `scripts/run_deferral.py`, read from the
    source of the three argument dataclasses without importing them; None when a source cannot be read (the full
    parse then finds the mistakes)."""
    try:
        spec = importlib.util.find_spec("transformers")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return None
        training = Path(next(iter(spec.submodule_search_locations))) / "training_args.py"
        ours = Path(__file__).with_name("arguments.py")
        options = {**_dataclass_options(ours, "ModelArguments"), **_dataclass_options(ours, "DataTrainingArguments"),
                   **_dataclass_options(training, "TrainingArguments")}
    except (OSError, SyntaxError, StopIteration, ValueError):
        return None
    return {**options, **{option: option.lstrip("-").replace("-", "_") for option in COMMAND_OPTIONS}}


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


def light_module(path: Path) -> types.ModuleType | None:
    """The hf_defer module at ``path`` (such as ``hf_defer/modeling/validators.py``, the shared argument rules) loaded
    from its file without importing the hf_defer package, when it imports only the standard library; else `None`.

    Example:

    ```python
    >>> import hf_defer.commands.flag_check as flag_check
    >>> from pathlib import Path
    >>> rules = flag_check.light_module(Path(flag_check.__file__).parents[1] / "modeling" / "validators.py")
    >>> rules.MISSING_EXPERT_MODES
    ('error', 'drop', 'mask')

    ```
    """
    name = f"_hf_defer_light_{path.parent.name}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] not in
                                                 sys.stdlib_module_names | {"__future__"}):
            return None
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] not in sys.stdlib_module_names
                                                for alias in node.names):
            return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def missing_expert_modes() -> tuple[str, ...]:
    """`hf_defer.modeling.validators.MISSING_EXPERT_MODES`, read without importing the hf_defer package (for the
    choices of `hf-defer evaluate --missing_expert`)."""
    return light_module(Path(__file__).resolve().parents[1] / "modeling" / "validators.py").MISSING_EXPERT_MODES


_LIGHT_CLASSES = ("ModelArguments", "DataTrainingArguments")
_TRUE, _FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")


def _light_dataclasses(source: Path) -> dict[str, type]:
    """`ModelArguments` and `DataTrainingArguments` built from the source of `arguments.py` without its imports of
    transformers: its standard-library imports, literal constants, module-level functions and these two classes
    (whose checks need nothing else)."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    kept: list[ast.stmt] = []
    shared: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level and node.module:  # a sibling of the standard library only
            module = light_module(source.parents[node.level - 1].joinpath(*node.module.split(".")).with_suffix(".py"))
            if module is not None:
                shared.update({alias.asname or alias.name: getattr(module, alias.name) for alias in node.names})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if node.__dict__.get("level", 0) == 0 and all(name.split(".")[0] in sys.stdlib_module_names
                                                          or name == "__future__" for name in modules):
                kept.append(node)
        elif isinstance(node, ast.FunctionDef) or (isinstance(node, ast.ClassDef) and node.name in _LIGHT_CLASSES):
            kept.append(node)
        elif isinstance(node, ast.Assign):
            try:
                ast.literal_eval(node.value)
            except ValueError:
                continue
            kept.append(node)
    module = sys.modules.setdefault("_hf_defer_light_arguments", types.ModuleType("_hf_defer_light_arguments"))
    module.__dict__.update(shared)
    exec(compile(ast.Module(body=kept, type_ignores=[]), str(source), "exec"), module.__dict__)  # noqa: S102
    return {name: getattr(module, name) for name in _LIGHT_CLASSES}


def _value(annotation: str, text: str) -> Any:
    """A flag's text as `HfArgumentParser` converts it for the annotation (bool, int, float or str)."""
    if "bool" in annotation:
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError(text)
        return text.lower() in _TRUE
    return int(text) if "int" in annotation else float(text) if "float" in annotation else text


def _check_values(argv: Sequence[str], values: dict[str, Any] | None, options: dict[str, str]) -> str | None:
    """The error of `ModelArguments` / `DataTrainingArguments`' own checks on the flags (or the JSON file's values),
    or None: when they pass, or when the flags cannot be read here as the full parser would (an abbreviated flag, a
    value that does not convert, a missing --model_name_or_path): the full parse then speaks."""
    try:
        classes = _light_dataclasses(Path(__file__).with_name("arguments.py"))
    except Exception:  # the source changed shape: leave it to the full parse
        return None
    if values is None:
        values = {}
        for index, token in enumerate(argv):
            if not token.startswith("--"):
                continue
            name, equals, text = token.partition("=")
            if name not in options:
                return None  # an abbreviation: argparse resolves it against every flag
            following = argv[index + 1] if index + 1 < len(argv) else None
            values[options[name]] = (text if equals else following if following is not None
                                     and not following.startswith("--") else None, name.startswith("--no"))
    kwargs: dict[str, dict[str, Any]] = {name: {} for name in _LIGHT_CLASSES}
    for class_name, cls in classes.items():
        for item in dataclasses.fields(cls):
            if item.name not in values:
                continue
            value = values[item.name]
            if isinstance(value, tuple):  # from the command line: (text, a --no_ flag)
                text, negated = value
                try:
                    value = (not negated) if text is None and "bool" in str(item.type) else _value(str(item.type),
                                                                                                     text)
                except (TypeError, ValueError):
                    return None
            kwargs[class_name][item.name] = value
    if "model_name_or_path" not in kwargs["ModelArguments"]:
        return None
    try:
        for class_name, cls in classes.items():
            cls(**kwargs[class_name])
    except ValueError as error:
        return " ".join(str(error).split())
    except Exception:  # not a check of ours (a value of another type in a JSON file...): the full parse says it
        return None
    return None


def _missing_file(flag: str, path: str) -> str | None:
    if not path or "://" in path or any(char in path for char in "*?[") or os.path.isfile(path):
        return None
    return f"--{flag} {path!r} does not exist" + (" (it is a folder)." if os.path.isdir(path) else ".")


def check_run_flags(argv: Sequence[str], check_output_dir: Callable[[str], None] | None = None) -> str | None:
    """The first mistake in the flags of a run that needs no heavy import to see, as one line, or None: unknown flags
    (or keys of a JSON flags file), each with the closest known one, then data files that do not exist, then the
    checks of `ModelArguments` and `DataTrainingArguments` on their values; then, unless
    `--overwrite_output_dir` is given, `check_output_dir(output_dir)` runs (it raises on a folder the run must not
    write into).

    Example:

    ```python
    >>> from hf_defer.commands.flag_check import check_run_flags
    >>> check_run_flags(["--model_name_or_path", "x", "--train_fiel", "train.csv", "--output_dir", "o"])
    'unrecognized argument: --train_fiel (did you mean --train_file?)'

    ```
    """
    options = run_options()
    if options is None or any(token in ("-h", "--help", "--help-all") for token in argv):
        return None
    json_file = len(argv) == 1 and argv[0].endswith(".json")
    if json_file:
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
        given = _flag_values(argv, options)
    for flag in DATA_FILE_FLAGS:
        problem = _missing_file(flag, given.get(flag, ""))
        if problem:
            return problem
    problem = _check_values(argv, values if json_file else None, options)
    if problem:
        return problem
    if check_output_dir is not None and given.get("output_dir") and "overwrite_output_dir" not in given:
        check_output_dir(given["output_dir"])
    return None
