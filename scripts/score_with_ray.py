"""Score a table with a saved deferral model on a Ray Data cluster: the decisions of `hf-defer predict`, row for row,
for data that does not fit one machine.

`pipeline("deferral")` is a plain callable on a batch, so Ray Data runs it as it would any model: `ray.data.read_parquet`
(or `read_csv`) splits the table into blocks across the cluster, `map_batches` hands each batch to an actor that loaded
the pipeline once (`concurrency` actors; one GPU each with `--num_gpus 1`), and `write_parquet` writes the decisions,
one file per block, as they are made. The columns are those of `hf-defer predict` (`prediction_header`: the id, the
copied columns, `label, defer, expert, class_label, class_score, margin` and one `expert_accuracy_<name>` per expert),
with the same values (tests/test_score_with_ray.py compares the two on the same rows).

Without `--address` the script starts a local Ray instance (`ray.init()`): a real engine on one machine's cores; on a
cluster, pass `--address auto` from a node of it (or `ray://head:10001`) and put the model folder where every node can
read it (a shared file system, or a Hub id).

Usage (needs the `scale` extra: `pip install -e ".[scale]"`):

```
python scripts/score_with_ray.py --model my-deferral-model --input items.parquet --output scored/ \\
    --text_column_names text --id_column_name id --concurrency 2
python scripts/score_with_ray.py --model head-only-model --input vectors.parquet --output scored/ --features_column_name features
```

Read the result with `pandas.read_parquet("scored/")` and sort it by the id column: the blocks' files come in no
particular order (`--preserve_order` keeps the input's order through Ray's execution, but the names Ray gives the
files do not follow it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hf_defer.commands.outputs import prediction_header, prediction_values
from hf_defer.commands.predict import input_length_limit, load_pipeline
from hf_defer.modeling import is_route_only


class DeferralScorer:
    """One deferral pipeline per Ray actor, loaded once, applied to each batch of rows.

    Args:
        model (`str`): a saved deferral model (folder or Hub id).
        id_column (`str`): the column that names each row (copied first into the output).
        text_columns (sequence of `str`, *optional*): the text column(s) of a text model, joined by `delimiter` as
            `hf-defer predict` joins `--text_column_names`.
        features_column (`str`, *optional*): the feature vectors of a head-only model.
        copy_columns (sequence of `str`, *optional*): input columns copied into the output after the id.
        batch_size (`int`): the pipeline's batch size.
    """

    def __init__(self, model: str, id_column: str, text_columns: Sequence[str] | None = None,
                 features_column: str | None = None, copy_columns: Sequence[str] = (), delimiter: str = " ",
                 batch_size: int = 32) -> None:
        self.pipe = load_pipeline(model)
        self.kind = self.pipe.input_kind
        if self.kind not in ("text", "features"):
            raise ValueError(f"--model takes {self.kind} inputs; this script scores text and feature-vector models.")
        if self.kind == "text" and not text_columns:
            raise ValueError("--model is a text model: name its text column(s) with --text_column_names.")
        self.id_column, self.copy_columns, self.batch_size = id_column, list(copy_columns), batch_size
        self.text_columns, self.features_column, self.delimiter = list(text_columns or ()), features_column, delimiter
        config = self.pipe.model.config
        self.route_only = is_route_only(config)
        self.header = prediction_header(config.expert_names, id_column, self.copy_columns, self.route_only, margin=True)
        self.kwargs: dict[str, Any] = {"return_margin": True}
        if self.kind == "text":  # truncated where the saved tokenizer says, as `hf-defer predict` does
            self.kwargs.update(truncation=True, max_length=input_length_limit(self.pipe))

    def inputs(self, batch: dict[str, np.ndarray]) -> list[Any]:
        if self.kind == "features":
            return [np.asarray(row, dtype=np.float32).tolist() for row in batch[self.features_column]]
        columns = [batch[name] for name in self.text_columns]
        return [self.delimiter.join(str(cell) for cell in cells if cell is not None) for cells in zip(*columns)]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        outputs = self.pipe(self.inputs(batch), batch_size=self.batch_size, **self.kwargs)
        decided = [prediction_values(out, self.route_only, margin=True) for out in outputs]
        result = {name: list(batch[name]) for name in [self.id_column, *self.copy_columns]}
        for index, name in enumerate(self.header[1 + len(self.copy_columns):]):
            result[name] = [row[index] for row in decided]
        return result


def check_arguments(model: str, input_path: str, output: str, columns: Sequence[str]) -> None:
    """What can be checked before Ray starts, each error naming the flag and the file or folder: `--input` an existing
    .parquet or .csv file holding `columns` (a CSV in UTF-8), `--output` a new folder, `--model` a deferral model
    (a folder hf_defer saved, or a Hub id) whose config loads."""
    import hf_defer  # noqa: F401  (registers the deferral model type)
    from transformers import AutoConfig

    from hf_defer.commands.inputs import scan_text_file
    from hf_defer.hub.model_source import check_model_source

    path = Path(input_path)
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".csv"):
        raise ValueError(f"--input must be a .parquet or .csv file, got {input_path!r}.")
    if not path.is_file():
        raise FileNotFoundError(f"--input {input_path!r} does not exist" + (" (it is a folder)." if path.is_dir()
                                                                            else "."))
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            found = list(pq.read_schema(path).names)
        except Exception as error:  # noqa: BLE001  (pyarrow's errors for a file that is not Parquet)
            raise ValueError(f"--input {input_path!r} cannot be read as Parquet: {error}") from None
    else:
        import csv

        scan_text_file(input_path, "--input", "csv")  # UTF-8, cells of any length: named by line
        with open(path, newline="", encoding="utf-8-sig") as handle:
            found = next(csv.reader(handle), [])
    missing = [name for name in columns if name not in found]
    if missing:
        raise ValueError(f"{missing} are not columns of --input {input_path}; its columns are {found}.")
    if Path(output).exists():
        raise ValueError(f"--output {output!r} exists: choose a new folder (nothing is overwritten).")
    check_model_source(model, "--model")
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError, KeyError) as error:
        reason = " ".join(str(error).split())[:300]
        raise ValueError(f"--model {model!r} is not a model that can be loaded: {reason}") from None
    if getattr(config, "model_type", None) != "deferral":
        raise ValueError(f"--model {model!r} holds a {getattr(config, 'model_type', None)!r} model, not a deferral "
                         "model: give the folder `hf-defer train` or `save_for_hub` wrote, or its Hub id.")


def score(model: str, input_path: str, output: str, id_column: str, text_columns: Sequence[str] | None = None,
          features_column: str | None = None, copy_columns: Sequence[str] = (), batch_size: int = 32,
          concurrency: int = 1, num_gpus: float = 0, preserve_order: bool = False, address: str | None = None,
          num_cpus: int | None = None, cpus_per_actor: float = 1.0) -> None:
    """Writes the deferral decisions of every row of `input_path` (Parquet or CSV) to the folder `output`
    (Parquet files, one per block), through `ray.data` `map_batches` with [`DeferralScorer`] actors."""
    needed = [id_column, *(text_columns or ()), *([features_column] if features_column else []), *copy_columns]
    check_arguments(model, input_path, output, needed)  # before Ray starts: each mistake named by its flag
    import ray

    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = preserve_order
    read = ray.data.read_parquet if Path(input_path).suffix.lower() == ".parquet" else ray.data.read_csv
    dataset = read(input_path)
    scored = dataset.map_batches(
        DeferralScorer, batch_size=batch_size, batch_format="numpy", concurrency=concurrency, num_gpus=num_gpus,
        num_cpus=cpus_per_actor,
        fn_constructor_kwargs={"model": model, "id_column": id_column, "text_columns": text_columns,
                               "features_column": features_column, "copy_columns": list(copy_columns),
                               "batch_size": batch_size})
    scored.write_parquet(output)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a saved deferral model (folder or Hub id)")
    parser.add_argument("--input", required=True, help="a .parquet or .csv table")
    parser.add_argument("--output", required=True, help="a new folder for the Parquet files")
    parser.add_argument("--id_column_name", default="id")
    parser.add_argument("--text_column_names", default=None, help="comma-separated; joined by a space")
    parser.add_argument("--features_column_name", default=None, help="a head-only model's feature vectors")
    parser.add_argument("--copy_columns", default="", help="comma-separated input columns to copy into the output")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=1, help="the number of pipeline actors")
    parser.add_argument("--num_gpus", type=float, default=0, help="GPUs per actor")
    parser.add_argument("--cpus_per_actor", type=float, default=1.0,
                        help="CPUs each actor reserves; leave some for reading and writing (actors holding every CPU "
                             "of the cluster stall the write)")
    parser.add_argument("--num_cpus", type=int, default=None, help="CPUs of a local Ray instance (default: all)")
    parser.add_argument("--address", default=None, help="a running Ray cluster ('auto', 'ray://head:10001')")
    parser.add_argument("--preserve_order", action="store_true",
                        help="keep the input's order through Ray's execution (the written files' names do not follow "
                             "it: sort the result by the id)")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.concurrency < 1:
        parser.error("--batch_size and --concurrency must be positive numbers.")
    split = lambda value: [part for part in (value or "").split(",") if part]  # noqa: E731
    try:
        score(args.model, args.input, args.output, args.id_column_name, split(args.text_column_names) or None,
              args.features_column_name, split(args.copy_columns), args.batch_size, args.concurrency, args.num_gpus,
              args.preserve_order, args.address, args.num_cpus, args.cpus_per_actor)
    except (ValueError, OSError) as error:  # the user's input or flags: one line, exit status 2, as hf-defer does
        print(f"{parser.prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
