"""`hf-defer predict`: the deferral pipeline's decision for every row of a file, written as a spreadsheet-safe CSV."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from .inputs import empty_text_rows, join_text_columns, pipeline_inputs, read_table, with_side_features
from .outputs import check_output_file, write_predictions

__all__ = ["input_length_limit", "load_pipeline", "parse_expert_costs", "predict_file", "read_table", "run_predict"]

logger = logging.getLogger(__name__)


def load_pipeline(model: str, trust_remote_code: bool = False) -> Any:
    """`pipeline("deferral", model=model)` (the installed hf_defer), or with `trust_remote_code` the pipeline whose
    code was saved with the model."""
    import hf_defer  # noqa: F401  (registers the "deferral" task)
    from transformers import pipeline

    if trust_remote_code:
        return pipeline("deferral-remote-code", model=model, trust_remote_code=True)
    return pipeline("deferral", model=model)


def input_length_limit(pipe: Any) -> int | None:
    """The longest text input, in tokens, as the model's saved tokenizer says (`model_max_length`), capped at the
    encoder's positions when the tokenizer sets no usable limit; None for image and feature models."""
    tokenizer = getattr(pipe, "tokenizer", None)
    if tokenizer is None or getattr(pipe, "input_kind", "text") != "text":
        return None
    limit = int(min(getattr(tokenizer, "model_max_length", 1 << 30), 1 << 30))
    encoder = getattr(pipe.model.config, "encoder", None)
    positions = getattr(encoder, "max_position_embeddings", None)
    if positions and limit > positions:
        offset = 2 if getattr(encoder, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
        limit = positions - offset
    return limit


def parse_expert_costs(value: str, expert_names: Sequence[str]) -> list[float]:
    """`--expert_costs 0.1,0.5` as floats, one per expert of the model, each finite and not negative."""
    parts = [part.strip() for part in value.split(",")]
    try:
        costs = [float(part) for part in parts]
    except ValueError:
        costs = None
    if costs is None or len(costs) != len(expert_names) or any(not 0 <= c < float("inf") for c in costs):
        raise ValueError(f"--expert_costs must be {len(expert_names)} comma-separated non-negative numbers, one per "
                         f"expert in the model's order ({', '.join(expert_names)}), e.g. "
                         f"{','.join(['0.1'] * len(expert_names))}; got {value!r}.")
    return costs


def input_column(table: Any, input_kind: str, text_columns: Sequence[str] | None, delimiter: str,
                 image_column_name: str | None, flag_input: str) -> tuple[Any, str]:
    """The table (text columns joined) and the column holding the model's input; errors name the flag and the fix."""
    if input_kind == "features":
        raise ValueError("--model is a head-only model over feature vectors; predict and evaluate take text or images.")
    if input_kind == "image":
        column = image_column_name or "image"
        if column not in table.column_names:
            raise ValueError(f"--image_column_name {column!r} is not a column of {flag_input}; its columns are "
                             f"{table.column_names}. Name the image column with --image_column_name.")
        return table, column
    columns = list(text_columns or ["text"])
    missing = [column for column in columns if column not in table.column_names]
    if missing:
        raise ValueError(f"--text_column_names {','.join(missing)!r} is not a column of {flag_input}; its columns are "
                         f"{table.column_names}. Name the text column with --text_column_names.")
    table, column = join_text_columns(table, columns, delimiter)
    empty = empty_text_rows(table, column)
    if empty:
        raise ValueError(f"{flag_input}, column {column!r}, row {empty[0]}: the text is empty ({len(empty)} such "
                         "row(s)); fill it in or remove the row.")
    return table, column


def predict_file(model: str, input_path: str, output: str = "predictions.csv", batch_size: int = 32,
                 text_column_names: Sequence[str] | str | None = None, text_pair_column_name: str | None = None,
                 image_column_name: str | None = None, id_column_name: str | None = None,
                 copy_columns: Sequence[str] | None = None, overwrite: bool = False, text_column_delimiter: str = " ",
                 trust_remote_code: bool = False, **pipeline_kwargs: Any) -> int:
    """Writes the deferral pipeline's output for every row of `input_path` to the CSV `output` (see
    [`write_predictions`]) and returns the row count. Text is truncated where the model's saved tokenizer says
    ([`input_length_limit`]). The CSV starts with the input's own id column (`id_column_name`, default `id` when
    the input has one, else the row number as `row`) and the `copy_columns`. An `output` that is the input, or that
    exists without `overwrite`, is refused before the model is loaded.

    Example:

    ```python
    >>> from hf_defer.commands.predict import predict_file
    >>> predict_file("my-deferral-model", "reviews.csv", "decisions.csv")  # doctest: +SKIP
    ```
    """
    check_output_file(output, [input_path], overwrite=overwrite)
    if isinstance(text_column_names, str):
        text_column_names = [text_column_names]
    table = read_table(input_path)
    flag_input = f"--input {input_path}"
    ids, id_column = None, "row"
    if id_column_name is not None and id_column_name not in table.column_names:
        raise ValueError(f"--id_column_name {id_column_name!r} is not a column of {flag_input}; its columns are "
                         f"{table.column_names}.")
    if id_column_name is not None or "id" in table.column_names:
        id_column = id_column_name or "id"
        ids = table[id_column]
    missing = [column for column in copy_columns or () if column not in table.column_names]
    if missing:
        raise ValueError(f"--copy_columns {missing} are not columns of {flag_input}; its columns are "
                         f"{table.column_names}.")
    if text_pair_column_name is not None and text_pair_column_name not in table.column_names:
        raise ValueError(f"--text_pair_column_name {text_pair_column_name!r} is not a column of {flag_input}; its "
                         f"columns are {table.column_names}.")
    copied = {column: table[column] for column in copy_columns or ()}
    if isinstance(pipeline_kwargs.get("expert_costs"), str):  # checked against the saved config, before the weights
        from transformers import AutoConfig

        import hf_defer  # noqa: F401  (registers the model type)

        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
        pipeline_kwargs["expert_costs"] = parse_expert_costs(pipeline_kwargs["expert_costs"], config.expert_names)
    pipe = load_pipeline(model, trust_remote_code)
    table, column = input_column(table, pipe.input_kind, text_column_names, text_column_delimiter,
                                 image_column_name, flag_input)
    if pipe.input_kind == "image":
        import datasets

        if isinstance(table.features[column], datasets.Value):
            table = table.cast_column(column, datasets.Image())  # a column of image paths
        inputs = pipeline_inputs(table, image_column=column)
    else:
        inputs = pipeline_inputs(table, column, text_pair_column_name)
        pipeline_kwargs.setdefault("truncation", True)
        pipeline_kwargs.setdefault("max_length", input_length_limit(pipe))
    inputs = with_side_features(inputs, table, pipe.model.config, flag_input)
    outputs = run_pipeline(pipe, inputs, batch_size, **pipeline_kwargs)
    return write_predictions(outputs, output, pipe.model.config.expert_names, ids=ids, id_column=id_column,
                             columns=copied, route_only=getattr(pipe.model.config, "route_only", False) is True)


def run_pipeline(pipe: Any, inputs: list[Any], batch_size: int, disable_progress_bar: bool = False,
                 **kwargs: Any) -> list[dict[str, Any]]:
    """The pipeline's outputs for `inputs`, batch by batch, with a progress bar on stderr."""
    from tqdm.auto import tqdm

    outputs = pipe((item for item in inputs), batch_size=batch_size, **kwargs)  # a generator: answers as they come
    return list(tqdm(outputs, total=len(inputs), desc="Deciding", unit="input", leave=False,
                     disable=disable_progress_bar or len(inputs) < batch_size))


def run_predict(args: argparse.Namespace) -> int:
    """`hf-defer predict`."""
    extra: dict[str, Any] = {}
    if args.defer_threshold is not None:
        extra["defer_threshold"] = args.defer_threshold
    if args.expert_costs is not None:
        extra["expert_costs"] = args.expert_costs  # checked against the model's experts once it is loaded
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be a positive number, got {args.batch_size}.")
    names = [name.strip() for name in args.text_column_names.split(",")] if args.text_column_names else None
    copied = [name.strip() for name in args.copy_columns.split(",") if name.strip()] if args.copy_columns else None
    count = predict_file(args.model, args.input, args.output, args.batch_size, names, args.text_pair_column_name,
                         args.image_column_name, args.id_column_name, copied, args.overwrite,
                         args.text_column_delimiter, args.trust_remote_code, **extra)
    print(f"wrote {count} decisions to {args.output}", file=sys.stderr)
    return 0
