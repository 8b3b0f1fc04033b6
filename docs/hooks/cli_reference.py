"""MkDocs hook: the command-line reference (docs/reference/cli.md) generated from the `hf-defer` parsers.

The page keeps its own introduction; the marker `<!-- hf-defer-cli -->` is replaced, at every build, by one section per
subcommand with a table of its flags, read from the argparse parsers the command itself uses (`hf_defer.commands.cli`,
`hf_defer.commands.arguments` for `train`, `hf_defer.commands.serve`, `hf_defer.commands.review`), so the page cannot drift
from `hf-defer <command> --help`. `render_cli_reference()` is the same text without MkDocs (tests/docs/test_site.py).
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARKER = "<!-- hf-defer-cli -->"
PAGE = "reference/cli.md"
ROOT = Path(__file__).resolve().parents[2]


def _import_root() -> None:
    """This checkout's hf_defer first, whatever is installed (as mkdocstrings' `paths: [.]` does for the API)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def command_parsers() -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(`hf-defer ...` command line, one-line help, parser) for the top-level command and each subcommand, in the order
    of `hf_defer.commands.cli.COMMANDS` (`review` as its `push` and `pull`)."""
    _import_root()
    from hf_defer.commands import cli

    top = cli.build_parser()
    yield "hf-defer", top.description or "", top
    subparsers = next(action for action in top._actions if isinstance(action, argparse._SubParsersAction))
    for name, command in cli.COMMANDS.items():
        if command.add_arguments is not None:
            yield f"hf-defer {name}", command.help, subparsers.choices[name]
        elif name == "train":
            yield f"hf-defer {name}", command.help, _train_parser()
        elif name == "serve":
            from hf_defer.commands.serve import build_serve_parser

            yield f"hf-defer {name}", command.help, build_serve_parser()
        elif name == "review":
            from hf_defer.commands.review import add_review_parser

            holder = argparse.ArgumentParser(prog="hf-defer")
            review = add_review_parser(holder.add_subparsers(dest="command"))
            yield f"hf-defer {name}", command.help, review
            actions = next(action for action in review._actions if isinstance(action, argparse._SubParsersAction))
            for sub_name, sub in actions.choices.items():
                yield f"hf-defer review {sub_name}", sub.description or _choice_help(actions, sub_name), sub
        else:  # a new command that parses its own flags: name its parser here
            raise RuntimeError(f"docs/hooks/cli_reference.py does not know the parser of `hf-defer {name}`")


def _choice_help(actions: argparse._SubParsersAction, name: str) -> str:
    return next((choice.help for choice in actions._choices_actions if choice.dest == name), "") or ""


def _train_parser() -> argparse.ArgumentParser:
    """`hf-defer train`'s parser as `run_train` builds it: `build_run_parser` and the `--json` it adds."""
    from hf_defer.commands.arguments import build_run_parser

    parser = build_run_parser(prog="hf-defer train")
    parser.add_argument_group("command").add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS,
        help="print only the run's final JSON on stdout (everything else goes to stderr); a bare --debug (no value, "
             "unlike TrainingArguments' --debug MODE) shows the traceback of an error")
    return parser


def _cell(text: str) -> str:
    """Text for a Markdown table cell: HTML and pipes escaped outside `code spans`, newlines joined."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(part.replace("|", "\\|") if part.startswith("`") and part.endswith("`") and len(part) > 1
                   else html.escape(part, quote=False).replace("|", "&#124;") for part in parts)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    try:  # "%(default)s" and the like, as --help shows them
        return parser._get_formatter()._expand_help(action)
    except (KeyError, TypeError, ValueError):
        return action.help


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.nargs == 0:
        return ""
    default = action.default
    if default is None or default == argparse.SUPPRESS:
        return ""
    if hasattr(default, "value"):  # enums of TrainingArguments
        default = default.value
    if isinstance(default, str) and default and default.strip() == default:
        return f"`{default}`"
    return f"`{default!r}`"  # numbers, lists; a blank or empty string quoted so that it shows


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return " \\| ".join(f"`{choice}`" for choice in action.choices)
    kind = getattr(action.type, "__name__", None) if action.type is not None else None  # None: a string
    kind = {"string_to_bool": "bool", "str": None}.get(kind, kind)
    text = f"`{kind}`" if kind else ""
    if action.nargs in ("+", "*"):
        text += " (several)"
    if isinstance(action, argparse._AppendAction):
        text += " (repeatable)"
    return text


def _rows(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> list[str]:
    rows = []
    for action in actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
        rows.append(f"| {flags} | {_value(action)} | {_default(action)} | {_cell(_help(parser, action))} |")
    return rows


def _slug(title: str) -> str:
    """The anchor MkDocs' `toc` gives a heading of plain words and hyphens."""
    return re.sub(r"[^a-z0-9-]+", "-", title.lower()).strip("-")


def _section(title: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## {title}", ""]
    if summary:
        lines += [_cell(summary[0].upper() + summary[1:]) + ("" if summary.rstrip().endswith(".") else "."), ""]
    commands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for action in commands:
        lines += ["Commands:", ""]
        lines += [f"- [`{title} {choice.dest}`](#{_slug(f'{title} {choice.dest}')}): {_cell(choice.help or '')}"
                  for choice in action._choices_actions]
        lines.append("")
    for group in parser._action_groups:
        rows = _rows(parser, group._group_actions)
        if not rows:
            continue
        heading = {"options": "Options", "optional arguments": "Options"}.get(group.title or "", group.title or "")
        if len(parser._action_groups) > 2 or heading != "Options":
            lines += [f"**{_cell(heading)}**" + (f": {_cell(group.description)}" if group.description else ""), ""]
        lines += ["| Flag | Value | Default | Description |", "| --- | --- | --- | --- |", *rows, ""]
    return lines


def render_cli_reference() -> str:
    """The Markdown that replaces the marker: one section per command line."""
    lines: list[str] = []
    for title, summary, parser in command_parsers():
        lines += _section(title, summary, parser)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: fill the command-line page (an error if its marker is missing: the page would say nothing)."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker {MARKER!r}: the generated reference has nowhere to go")
    return markdown.replace(MARKER, render_cli_reference())
