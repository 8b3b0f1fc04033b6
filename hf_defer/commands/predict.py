"""`hf-defer predict`: the deferral pipeline's decision for every row of a file, written as a spreadsheet-safe CSV."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .inputs import TableStream, empty_text_rows, join_text_columns, read_table, side_feature_rows
from .outputs import (
    PredictionWriter,
    check_output_file,
    check_provenance,
    file_digest,
    prediction_format,
    prediction_header,
    prediction_values,
    provenance_path,
    read_provenance,
    remove_provenance,
    resume_predictions,
    write_provenance,
)
from ..modeling.surrogate_routing import is_route_only

__all__ = ["input_length_limit", "load_pipeline", "parse_expert_costs", "predict_file", "read_table", "run_predict"]

logger = logging.getLogger(__name__)


def load_pipeline(model: str, trust_remote_code: bool = False, device: Any = None, backend: str = "torch") -> Any:
    """`pipeline("deferral", model=model)` (the installed hf_defer), or with `trust_remote_code` the pipeline whose
    code was saved with the model; on `device` when given. A `model` that is neither a folder here nor a Hub id that
    can be loaded fails first, at once ([`check_model_source`]). `backend="onnx"`: the pipeline over the ONNX export
    in the folder `model` (`hf_defer.onnx.onnx_pipeline`, CPU)."""
    if backend == "onnx":
        if trust_remote_code:
            raise ValueError("--trust_remote_code runs the code saved with a PyTorch model; --backend onnx runs an "
                             "exported graph: pass one of them.")
        from ..onnx import onnx_pipeline, require_onnx

        require_onnx()
        return onnx_pipeline(model)
    if backend != "torch":
        raise ValueError(f"--backend must be 'torch' or 'onnx', got {backend!r}.")
    import hf_defer  # noqa: F401  (registers the "deferral" task)
    from transformers import pipeline

    from ..hub.model_source import check_model_source

    check_model_source(model, "--model")  # a mistyped folder fails here, naming the folder and the Hub id tried
    placed = {} if device is None else {"device": device}
    if trust_remote_code:
        return pipeline("deferral-remote-code", model=model, trust_remote_code=True, **placed)
    return pipeline("deferral", model=model, **placed)


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
        raise ValueError("--model is a head-only model over feature vectors; evaluate takes text or images.")
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


def _input_reader(columns: Sequence[str], input_kind: str, text_columns: Sequence[str] | None, delimiter: str,
                  text_pair_column: str | None, image_column_name: str | None, features_column: str | None,
                  flag_input: str) -> Callable[[Mapping[str, list[Any]], int], list[Any]]:
    """Checks that the input has the model's columns (errors name the flag and the fix) and returns what turns one
    chunk of rows, the first at `start`, into the pipeline's inputs (an empty text is an error naming its row)."""
    if input_kind == "features":
        column = features_column or "features"
        if column not in columns:
            raise ValueError(f"--features_column_name {column!r} is not a column of {flag_input}; its columns are "
                             f"{list(columns)}. --model is a head-only model over feature vectors: give each row's "
                             "vector as a list (Parquet, JSON Lines) or a JSON list in a CSV cell.")
        return lambda chunk, start: _feature_vectors(chunk[column], start, column, flag_input)
    if input_kind == "image":
        column = image_column_name or "image"
        if column not in columns:
            raise ValueError(f"--image_column_name {column!r} is not a column of {flag_input}; its columns are "
                             f"{list(columns)}. Name the image column with --image_column_name.")
        return lambda chunk, start: list(chunk[column])
    names = list(text_columns or ["text"])
    missing = [column for column in names if column not in columns]
    if missing:
        raise ValueError(f"--text_column_names {','.join(missing)!r} is not a column of {flag_input}; its columns are "
                         f"{list(columns)}. Name the text column with --text_column_names.")
    if text_pair_column is not None and text_pair_column not in columns:
        raise ValueError(f"--text_pair_column_name {text_pair_column!r} is not a column of {flag_input}; its "
                         f"columns are {list(columns)}.")
    shown = "+".join(names)

    def texts(chunk: Mapping[str, list[Any]], start: int) -> list[Any]:
        if len(names) == 1:
            values = chunk[names[0]]
        else:  # joined as run_classification.py joins --text_column_names
            values = [delimiter.join(str(value) for value in row if value is not None)
                      for row in zip(*(chunk[name] for name in names))]
        empty = [row for row, text in enumerate(values) if not isinstance(text, str) or not text.strip()]
        if empty:
            raise ValueError(f"{flag_input}, column {shown!r}, row {start + empty[0]}: the text is empty ({len(empty)} "
                             f"such row(s) in rows {start}-{start + len(values) - 1}); fill it in or remove the row.")
        if text_pair_column is None:
            return list(values)
        return [{"text": text, "text_pair": pair} for text, pair in zip(values, chunk[text_pair_column])]

    return texts


def _feature_vectors(values: list[Any], start: int, column: str, flag_input: str) -> list[Any]:
    """Feature vectors of a chunk: lists, or JSON lists in the text cells of a CSV file."""
    vectors = []
    for row, value in enumerate(values):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{flag_input}, column {column!r}, row {start + row}: expected a feature vector (a list "
                             f"of numbers, or a JSON list in a CSV cell), got {values[row]!r:.80}.")
        vectors.append(value)
    return vectors


_UNRECORDED_CONFIG = ("_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset",
                      "_attn_implementation_internal", "defer_threshold", "expert_costs")
"""Config entries that say where or how a model was loaded, not what it decides (the threshold and costs are recorded
as the run used them)."""


def model_fingerprint(model: str, pipe: Any) -> dict[str, str]:
    """What identifies a loaded deferral model: the name it was given by, `sha256` of its config (where and how it was
    loaded left out) and of its weights (each tensor's name, dtype, shape and bytes, in name order: the same for
    a copy of the folder, another file format or a moved file)."""
    import torch

    config = {key: value for key, value in pipe.model.config.to_dict().items() if key not in _UNRECORDED_CONFIG}
    weights = hashlib.sha256()
    for name, tensor in sorted(pipe.model.state_dict().items()):
        tensor = tensor.detach().to("cpu").contiguous().reshape(-1)
        weights.update(f"{name}|{tensor.dtype}|{tensor.numel()}|".encode())
        weights.update(tensor.view(torch.uint8).numpy().tobytes())
    return {"name": model,
            "config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest(),
            "weights_sha256": weights.hexdigest()}


def _column_types(stream: TableStream, names: Sequence[str]) -> dict[str, Any]:
    """The `pyarrow` types of the id and copied columns (the row number: int64), for a Parquet output."""
    import pyarrow as pa

    features = stream.features
    types: dict[str, Any] = {}
    for name in names:
        if features is not None and name in features:
            types[name] = features.arrow_schema.field(name).type
        else:
            types[name] = pa.int64() if name == "row" and name not in stream.column_names else None
    return types


def predict_file(model: str, input_path: str, output: str = "predictions.csv", batch_size: int = 32,
                 text_column_names: Sequence[str] | str | None = None, text_pair_column_name: str | None = None,
                 image_column_name: str | None = None, id_column_name: str | None = None,
                 copy_columns: Sequence[str] | None = None, overwrite: bool = False, text_column_delimiter: str = " ",
                 trust_remote_code: bool = False, features_column_name: str | None = None, resume: bool = False,
                 chunk_size: int = 4096, disable_progress_bar: bool = False, backend: str = "torch",
                 **pipeline_kwargs: Any) -> int:
    """Writes the deferral pipeline's output for every row of `input_path` to `output` (CSV, JSON Lines or Parquet
    by its extension; see [`write_predictions`] for the columns) and returns the row count.

    The input (csv, json, jsonl, parquet or txt) is read in chunks of `chunk_size` rows by `datasets` in streaming
    mode and each chunk's decisions are written, in input order, as soon as they are made, in whole rows: memory does
    not grow with the file. Beside `output`, `<output>.hf_defer.json` records what wrote it (written atomically
    before the first row): the model (its name, and `sha256` of its config and of its weights), the deferral
    threshold and expert costs the decisions used, the input (name, size, `sha256` of its bytes), the options and
    the columns. With `resume`, an `output` without that record (the user's own file) is refused and left as it is,
    and so is one written with another model, threshold, costs, input or options; otherwise the whole rows that a
    killed run left in a CSV or JSON Lines `output` are kept (a partial last row is cut off), their ids checked
    against the input's first rows, and the run goes on from the next row: the file ends as an uninterrupted run's
    would. A progress bar with rate and ETA goes to stderr.

    Started by `accelerate launch` on several processes (or `hf-defer predict --num_processes N`), each chunk is
    split between the processes (`PartialState.split_between_processes`; one GPU each when there are GPUs) and the
    main process writes the gathered decisions, in order: the file is the one-process file.

    Text is truncated where the model's saved tokenizer says ([`input_length_limit`]); a head-only model reads its
    feature vectors from `features_column_name` (default `features`: lists, or JSON lists in a CSV). The output
    starts with the input's own id column (`id_column_name`, default `id` when the input has one, else the row
    number as `row`) and the `copy_columns`. An `output` that is the input, or that exists without `overwrite` or
    `resume`, is refused before the model is loaded. `backend="onnx"` runs the ONNX export in the folder `model`
    (`load_pipeline`).

    Example:

    ```python
    >>> from hf_defer.commands.predict import predict_file
    >>> predict_file("my-deferral-model", "reviews.csv", "decisions.csv")  # doctest: +SKIP
    ```
    """
    data_format = _check_run_options(output, resume, overwrite, chunk_size)
    state = _distributed_state()
    main = state is None or state.is_main_process
    _on_main(state, lambda: check_output_file(output, [input_path], overwrite=overwrite or resume))
    resuming = resume and os.path.exists(output)
    _on_main(state, lambda: _check_record(output, resuming, overwrite))  # before the model: a user's own file
    if isinstance(text_column_names, str):
        text_column_names = [text_column_names]
    stream = TableStream(input_path, chunk_size=max(chunk_size, batch_size))
    flag_input = f"--input {input_path}"
    id_column, copied = _output_columns(stream, id_column_name, copy_columns, flag_input)
    _parse_expert_costs(model, trust_remote_code, pipeline_kwargs)  # against the saved config, before the weights
    pipe = load_pipeline(model, trust_remote_code, device=None if state is None else state.device, backend=backend)
    to_inputs = _input_reader(stream.column_names, pipe.input_kind, text_column_names, text_column_delimiter,
                              text_pair_column_name, image_column_name, features_column_name, flag_input)
    _prepare_input_kind(pipe, stream, image_column_name, pipeline_kwargs)
    config = pipe.model.config
    route_only = is_route_only(config)
    pipeline_kwargs.setdefault("return_margin", True)  # the output shows why an input was (not) deferred
    scored_by = bool(getattr(pipe.model, "quantized", False))  # an int8 export: which graph scored each row
    header = prediction_header(config.expert_names, id_column, copied, route_only, margin=True, scored_by=scored_by)
    side = _side_feature_kinds(config, stream, flag_input)
    record = _provenance_record(config, input_path, header, pipeline_kwargs, {
        "text_column_names": list(text_column_names or []) or None, "text_pair_column_name": text_pair_column_name,
        "image_column_name": image_column_name, "text_column_delimiter": text_column_delimiter,
        "features_column_name": features_column_name})
    found = _on_main(state, lambda: _start_output(output, record, model, pipe, input_path, resuming, header))
    done, written_digest = found if found is not None else (0, None)
    writer = None
    if main:
        writer = PredictionWriter(output, header, data_format, _column_types(stream, [id_column, *copied]),
                                  append=found is not None)
    from tqdm.auto import tqdm

    from .progress import progress_bars_disabled

    progress = tqdm(total=stream.num_rows, initial=done, desc="Deciding", unit="row", dynamic_ncols=True,
                    disable=disable_progress_bar or not main or (stream.num_rows or 0) < batch_size
                    or progress_bars_disabled())
    start, written, skipped = 0, 0, hashlib.sha256()
    try:
        for chunk in stream:
            size = len(chunk[stream.column_names[0]])
            ids = chunk[id_column] if id_column in chunk else range(start, start + size)
            skip = min(max(done - start, 0), size)
            if skip and writer is not None:
                _check_resumed_ids(writer, ids[:skip], skipped, start + skip, done, written_digest, output,
                                   flag_input)
            if skip == size:
                start += size
                continue
            # the whole chunk, even where resumed inside it: the same batches, so the same floats, as one run
            inputs = side_feature_rows(to_inputs(chunk, start), chunk, side,
                                       "features" if pipe.input_kind == "features" else "text", start)
            outputs = _decide(pipe, inputs, batch_size, state, **pipeline_kwargs)[skip:]
            if writer is not None:
                _write_decisions(writer, [ids, *(chunk[name] for name in copied)], skip, outputs, route_only,
                                 scored_by)
            written += len(outputs)
            progress.update(len(outputs))
            start += size
    except BaseException:
        if writer is not None:
            _close_failed_output(writer, output, nothing_written=written == 0 and found is None)
        raise
    finally:
        progress.close()
    if done > start:
        raise ValueError(f"--resume: --output {output!r} holds {done} rows, more than the {start} rows of "
                         f"{flag_input}; was it written from another input?")
    if writer is not None:
        writer.close()
    return start


def _check_run_options(output: str, resume: bool, overwrite: bool, chunk_size: int) -> str:
    """The output's format (`prediction_format`), once `--resume`, `--overwrite` and the chunk size agree."""
    if resume and overwrite:
        raise ValueError("--resume continues --output and --overwrite replaces it: pass one of them.")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number, got {chunk_size}.")
    data_format = prediction_format(output)
    if resume and data_format == "parquet":
        raise ValueError(f"--resume continues a .csv, .jsonl or .json --output, got {output!r}: a Parquet file is "
                         "only readable once complete (its footer is written last).")
    return data_format


def _output_columns(stream: TableStream, id_column_name: str | None, copy_columns: Sequence[str] | None,
                    flag_input: str) -> tuple[str, list[str]]:
    """The id column (the input's `--id_column_name`, else `id` when there is one, else `row`) and the copied
    columns, each checked to be a column of the input."""
    id_column = id_column_name or ("id" if "id" in stream.column_names else "row")
    if id_column_name is not None and id_column_name not in stream.column_names:
        raise ValueError(f"--id_column_name {id_column_name!r} is not a column of {flag_input}; its columns are "
                         f"{stream.column_names}.")
    missing = [column for column in copy_columns or () if column not in stream.column_names]
    if missing:
        raise ValueError(f"--copy_columns {missing} are not columns of {flag_input}; its columns are "
                         f"{stream.column_names}.")
    return id_column, list(copy_columns or ())


def _parse_expert_costs(model: str, trust_remote_code: bool, pipeline_kwargs: dict[str, Any]) -> None:
    """Turns `--expert_costs` given as text into numbers, checked against the saved config's experts (in place)."""
    if not isinstance(pipeline_kwargs.get("expert_costs"), str):
        return
    from transformers import AutoConfig

    import hf_defer  # noqa: F401  (registers the model type)
    from ..hub.model_source import check_model_source

    check_model_source(model, "--model")
    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    pipeline_kwargs["expert_costs"] = parse_expert_costs(pipeline_kwargs["expert_costs"], config.expert_names)


def _prepare_input_kind(pipe: Any, stream: TableStream, image_column_name: str | None,
                        pipeline_kwargs: dict[str, Any]) -> None:
    """Images: a column of paths read as images; text: truncated where the model's tokenizer says (in place)."""
    if pipe.input_kind == "image":
        import datasets

        column = image_column_name or "image"
        if stream.features is None or isinstance(stream.features[column], datasets.Value):
            stream.cast_column(column, datasets.Image())  # a column of image paths
    elif pipe.input_kind == "text":
        pipeline_kwargs.setdefault("truncation", True)
        pipeline_kwargs.setdefault("max_length", input_length_limit(pipe))


def _side_feature_kinds(config: Any, stream: TableStream, flag_input: str) -> dict[str, bool]:
    """The model's side features (name -> whether numeric), each checked to be a column of the input."""
    specs = getattr(config, "side_features", None) or []
    side = {spec["name"]: spec["kind"] == "numeric" for spec in specs}  # name -> numeric
    missing = [name for name in side if name not in stream.column_names]
    if missing:
        raise ValueError(f"the model routes on the side features {list(side)}: {flag_input} lacks the column(s) "
                         f"{missing}; its columns are {stream.column_names}.")
    return side


def _provenance_record(config: Any, input_path: str, header: list[str], pipeline_kwargs: dict[str, Any],
                       options: dict[str, Any]) -> dict[str, Any]:
    """What writes the output (the model's fingerprint and the input's digest are added on the main process): the
    threshold and costs the decisions use, the input, the options and the columns."""
    return {"defer_threshold": float(pipeline_kwargs.get("defer_threshold", config.defer_threshold)),
            "expert_costs": [float(cost) for cost in pipeline_kwargs.get("expert_costs")
                             or getattr(config, "expert_costs", None) or [0.0] * config.num_experts],
            "input": {"name": os.path.basename(input_path), "size": os.path.getsize(input_path)},
            "options": {**options,
                        "pipeline": {key: value for key, value in sorted(pipeline_kwargs.items())
                                     if key not in ("defer_threshold", "expert_costs")}},
            "columns": header}


def _start_output(output: str, record: dict[str, Any], model: str, pipe: Any, input_path: str, resuming: bool,
                  header: list[str]) -> tuple[int, str] | None:
    """On the main process: the record completed and written beside the output, after checking, when resuming,
    that it is the earlier run's; the rows and id digest an earlier run left (None: none)."""
    record["model"] = model_fingerprint(model, pipe)
    record["input"]["sha256"] = file_digest(input_path)
    found = None
    if resuming:
        check_provenance(output, record)  # the same model, threshold, costs, input and options, or nothing
        found = resume_predictions(output, header)
    write_provenance(output, record)
    return found


def _check_resumed_ids(writer: PredictionWriter, ids: Sequence[Any], digest: Any, end: int, done: int,
                       written_digest: str | None, output: str, flag_input: str) -> None:
    """Adds the ids of rows an earlier run wrote (up to row `end`) to `digest`; once all `done` are in, they must be
    the ids the output holds."""
    for value in ids:
        digest.update(writer.id_text(value).encode("utf-8", "surrogateescape") + b"\x1f")
    if end == done and digest.hexdigest() != written_digest:
        raise ValueError(f"--resume: the {done} rows of --output {output!r} do not hold the ids of the "
                         f"first {done} rows of {flag_input}; was it written from another input? Choose "
                         "another --output, or pass --overwrite to start again.")


def _write_decisions(writer: PredictionWriter, columns: list[Sequence[Any]], skip: int, outputs: list[dict[str, Any]],
                     route_only: bool, scored_by: bool = False) -> None:
    """Writes a chunk's decisions from row `skip` on, each after its id and copied columns."""
    writer.write_rows([[column[row] for column in columns] + prediction_values(out, route_only, True, scored_by)
                       for row, out in enumerate(outputs, start=skip)])


def _close_failed_output(writer: PredictionWriter, output: str, nothing_written: bool) -> None:
    """Closes the output of a failed run; one that holds nothing but a header is removed with its record, so that a
    rerun needs no --overwrite."""
    writer.close()
    if nothing_written:
        os.remove(output)  # nothing but a header: leave no file that a rerun would have to --overwrite
        remove_provenance(output)


def _check_record(output: str, resuming: bool, overwrite: bool) -> None:
    """Before the model is loaded: a file to `--resume` must be one hf_defer wrote (its record beside it); a record
    file that is not hf_defer's is never replaced without `--overwrite`."""
    if resuming:
        check_provenance(output)
    elif not overwrite and os.path.exists(provenance_path(output)) and read_provenance(output) is None:
        raise FileExistsError(f"{str(provenance_path(output))!r}, where hf-defer predict records what wrote --output, "
                              "exists and is not hf_defer's; pass --overwrite to replace it, or choose another "
                              "--output.")


def _decide(pipe: Any, inputs: list[Any], batch_size: int, state: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The pipeline's outputs for one chunk; on several processes each decides its share and all are gathered."""
    if state is None:
        return list(pipe(inputs, batch_size=batch_size, **kwargs)) if inputs else []
    from accelerate.utils import gather_object

    with state.split_between_processes(inputs) as mine:
        outputs = list(pipe(mine, batch_size=batch_size, **kwargs)) if mine else []
    return gather_object(outputs)  # in process order: the chunk's order


def _distributed_state() -> Any:
    """accelerate's `PartialState` when launched on several processes (`accelerate launch`), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from accelerate import PartialState

    return PartialState()


def _on_main(state: Any, function: Callable[[], Any]) -> Any:
    """`function()` on the main process only (it reads or changes the output file), its result or error given to
    every process."""
    if state is None:
        return function()
    from accelerate.utils import broadcast_object_list

    message: list[Any] = [None, None]
    if state.is_main_process:
        try:
            message = [function(), None]
        except (ValueError, OSError) as error:
            message = [None, error]
    broadcast_object_list(message)
    if message[1] is not None:
        raise message[1]
    return message[0]


def run_pipeline(pipe: Any, inputs: list[Any], batch_size: int, disable_progress_bar: bool = False,
                 **kwargs: Any) -> list[dict[str, Any]]:
    """The pipeline's outputs for `inputs` (with each input's deferral `margin`), batch by batch, with a progress bar
    on stderr."""
    from tqdm.auto import tqdm

    kwargs.setdefault("return_margin", True)  # predictions.csv shows why an input was (not) deferred
    outputs = pipe((item for item in inputs), batch_size=batch_size, **kwargs)  # a generator: answers as they come
    return list(tqdm(outputs, total=len(inputs), desc="Deciding", unit="input", leave=False,
                     disable=disable_progress_bar or len(inputs) < batch_size))


def run_predict(args: argparse.Namespace) -> int:
    """`hf-defer predict`; with `--num_processes N` (N > 1) it runs itself under `accelerate launch`."""
    extra: dict[str, Any] = {}
    if args.defer_threshold is not None:
        extra["defer_threshold"] = args.defer_threshold
    if args.expert_costs is not None:
        extra["expert_costs"] = args.expert_costs  # checked against the model's experts once it is loaded
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be a positive number, got {args.batch_size}.")
    processes = getattr(args, "num_processes", 1) or 1
    if processes < 1:
        raise ValueError(f"--num_processes must be a positive number, got {processes}.")
    if processes > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return launch_predict(args, processes)
    names = [name.strip() for name in args.text_column_names.split(",")] if args.text_column_names else None
    copied = [name.strip() for name in args.copy_columns.split(",") if name.strip()] if args.copy_columns else None
    count = predict_file(args.model, args.input, args.output, args.batch_size, names, args.text_pair_column_name,
                         args.image_column_name, args.id_column_name, copied, args.overwrite,
                         args.text_column_delimiter, args.trust_remote_code,
                         features_column_name=getattr(args, "features_column_name", None),
                         resume=getattr(args, "resume", False), backend=getattr(args, "backend", "torch"), **extra)
    if int(os.environ.get("RANK", "0")) == 0:
        threshold = args.defer_threshold
        if threshold is None:  # the model's own (calibrated) threshold, as the pipeline used it
            from transformers import AutoConfig

            threshold = AutoConfig.from_pretrained(args.model,
                                                   trust_remote_code=args.trust_remote_code).defer_threshold
        print(f"wrote {count} decisions to {args.output}; deferred where margin > the deferral threshold "
              f"{float(threshold):.6g}", file=sys.stderr)
    return 0


def launch_predict(args: argparse.Namespace, processes: int) -> int:
    """`hf-defer predict` again under `accelerate launch --num_processes N` (GPUs when there are, else CPU
    processes with gloo): the flags as given, `--num_processes` aside. Returns the launch's exit status."""
    import socket
    import subprocess

    flags: list[str] = []
    for name, value in vars(args).items():
        if name in ("command", "num_processes", "debug") or value is None or value is False:
            continue
        flags += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    with socket.socket() as sock:  # a free port for the processes' rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(port), "-m", "hf_defer.commands.cli", "predict", *flags]
    return subprocess.run(command, check=False).returncode
