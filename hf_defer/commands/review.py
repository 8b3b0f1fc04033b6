"""`hf-defer review push|pull`: the review loop from the command line.

- `hf-defer review push --url URL --project NAME --model MODEL --input FILE`: run a saved deferral model on every row
  of a file and send the inputs it defers to a Label Studio project (created for the model's classes if missing).
- `hf-defer review pull --url URL --project NAME --output answers.csv [--columns_output reviewers.csv]`: append the
  answers given since the last pull to `answers.csv` (item, annotator, answer, time, ...) and write one column per
  reviewer to `reviewers.csv` (an existing one is replaced only with `--overwrite`).

The API token is read from the environment variable named by `--token_env` (`LABEL_STUDIO_API_KEY` by default); no
flag takes the token itself, so it never lands in a shell history, a file or a log.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..review.client import DEFAULT_TOKEN_ENV, ReviewServerError
from .flags import PlainRawDescriptionHelpFormatter

__all__ = ["add_review_parser", "main"]


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the Label Studio server, e.g. http://localhost:8080")
    parser.add_argument("--project", required=True, help="the project's id, or its title")
    parser.add_argument("--token_env", default=DEFAULT_TOKEN_ENV,
                        help=f"environment variable holding the API token (default {DEFAULT_TOKEN_ENV})")


def add_review_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `review` (with `push` and `pull`) to the `hf-defer` subcommands; `main` runs the parsed namespace."""
    review = subparsers.add_parser("review", help="send deferred inputs to Label Studio reviewers, pull answers back",
                                   description=__doc__, formatter_class=PlainRawDescriptionHelpFormatter)
    actions = review.add_subparsers(dest="review_command", required=True, metavar="{push,pull}")
    push = actions.add_parser("push", help="send the inputs a saved deferral model defers to a Label Studio project")
    _server_options(push)
    push.add_argument("--model", required=True, help="saved deferral model: a local folder or a Hub id")
    push.add_argument("--input", required=True, help="csv, json, jsonl, parquet or txt file of inputs")
    push.add_argument("--text_column_name", default="text", help="the column reviewers read (default 'text')")
    push.add_argument("--id_column_name", default=None, help="a column of unique ids (default: tasks are keyed by a "
                      "hash of the text)")
    push.add_argument("--batch_size", type=int, default=32, help="inputs per forward pass and tasks per import")
    push.add_argument("--max_length", type=int, default=None, help="truncate inputs to this many tokens")
    push.add_argument("--no_create", action="store_true", help="fail instead of creating a missing project")
    pull = actions.add_parser("pull", help="append the answers given since the last pull to a CSV file")
    _server_options(pull)
    pull.add_argument("--output", default="answers.csv", help="the long table of answers, kept across pulls")
    pull.add_argument("--columns_output", default=None,
                      help="also write one column per reviewer (None where they did not review) to this CSV")
    pull.add_argument("--overwrite", action="store_true",
                      help="replace an existing --columns_output file (rebuilt from --output: columns you added to it, "
                           "such as your own labels, are lost)")
    pull.add_argument("--min_answers", type=int, default=1, help="reviewers with fewer answers get no column")
    pull.add_argument("--model", default=None, help="check the project against this model's classes")
    review.set_defaults(handler=run_review)
    return review


def _push(options: argparse.Namespace) -> str:
    from transformers import pipeline

    import hf_defer  # noqa: F401  (registers the "deferral" task)
    from ..review.client import connect
    from ..review.pushing import push_dataset
    from .inputs import read_table

    classifier = pipeline("deferral", model=options.model)
    project = connect(options.url, options.project, classifier.model.config.id2label, token_env=options.token_env,
                      create=not options.no_create)
    kwargs = {} if options.max_length is None else {"truncation": True, "max_length": options.max_length}
    report = push_dataset(project, classifier, read_table(options.input), text_column=options.text_column_name,
                          id_column=options.id_column_name, batch_size=options.batch_size, **kwargs)
    return f"project {project.title!r} (id {project.project_id}) at {project.url}: {report}"


def _pull(options: argparse.Namespace) -> str:
    from ..review.client import connect
    from ..review.pulling import pull_to_csv, read_answers, reviews_to_columns

    if options.columns_output and os.path.exists(options.columns_output) and not options.overwrite:
        raise FileExistsError(  # before the server is asked: nothing pulled, nothing written
            f"--columns_output {options.columns_output!r} exists, and may hold columns you added (such as your own "
            f"labels); pass --overwrite to rebuild it from {options.output!r}, or name another file.")
    id2label = None
    if options.model is not None:
        from transformers import AutoConfig

        import hf_defer  # noqa: F401  (registers the "deferral" config)

        id2label = AutoConfig.from_pretrained(options.model).id2label
    project = connect(options.url, options.project, id2label, token_env=options.token_env, create=False)
    result = pull_to_csv(project, options.output)
    message = (f"project {project.title!r}: {len(result.table)} new answer(s) appended to {options.output}, "
               f"{len(result.skipped)} skipped, {len(result.gone)} pulled before no longer on the server")
    if options.columns_output:
        table = read_answers(options.output)
        if len(table):
            reviews_to_columns(table, min_answers=options.min_answers).to_csv(options.columns_output, index=False)
            message += f"; reviewer columns in {options.columns_output}"
    return message


def run_review(options: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        print(_push(options) if options.review_command == "push" else _pull(options))
    except (ValueError, ReviewServerError, FileNotFoundError, FileExistsError) as error:
        print(f"hf-defer review {options.review_command}: error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`hf-defer review ...` on its own: `main(["push", "--url", ...])`."""
    parser = argparse.ArgumentParser(prog="hf-defer")
    add_review_parser(parser.add_subparsers(dest="command", required=True))
    options = parser.parse_args(["review", *(sys.argv[1:] if argv is None else argv)])
    return options.handler(options)


if __name__ == "__main__":
    raise SystemExit(main())
