"""The `hf-defer` command (also `python -m hf_defer`).

- `hf-defer train ...`: the flags of `scripts/run_deferral.py` (see [`run_deferral`]), or one JSON file of them.
- `hf-defer predict --model PATH_OR_ID --input FILE`: the deferral pipeline's decision for every row of a file,
  written as CSV (`predictions.csv` by default).
- `hf-defer evaluate --model PATH_OR_ID --input FILE`: the deferral metrics of a saved model on a labelled file.

`hf-defer <command> --help` lists every flag with its meaning.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import datasets
import numpy as np
import torch

__all__ = ["evaluate_file", "main", "predict_file", "read_table"]

USAGE = """usage: hf-defer {train,predict,evaluate} ...

  train     train, evaluate, calibrate and save a deferral model (the flags of scripts/run_deferral.py)
  predict   decisions of a saved deferral model for every row of a file, as CSV
  evaluate  deferral metrics of a saved model on a labelled file

`hf-defer <command> --help` lists the flags of a command."""


def read_table(path: str) -> datasets.Dataset:
    """A csv, json, jsonl or parquet file as a `datasets.Dataset`; a `.txt` file holds one text per line."""
    extension = path.rsplit(".", 1)[-1].lower()
    if extension == "txt":
        with open(path) as handle:
            return datasets.Dataset.from_dict({"text": [line.rstrip("\n") for line in handle if line.strip()]})
    builders = {"csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}
    if extension not in builders:
        raise ValueError(f"--input must be a csv, json, jsonl, parquet or txt file, got {path!r}.")
    return datasets.load_dataset(builders[extension], data_files=path, split="train")


def _input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Saved deferral model: a local folder or a Hub id.")
    parser.add_argument("--input", required=True, help="csv, json, jsonl or parquet file (txt: one text per line).")
    parser.add_argument("--text_column_name", default=None, help="Text column (default: 'text').")
    parser.add_argument("--text_pair_column_name", default=None, help="Second text of a text pair.")
    parser.add_argument("--image_column_name", default=None, help="Image column (paths or images), vision models.")
    parser.add_argument("--batch_size", type=int, default=32, help="Inputs per forward pass.")


def _load_pipeline(model: str) -> Any:
    import hf_defer  # noqa: F401  (registers the "deferral" task)
    from transformers import pipeline

    return pipeline("deferral", model=model)


def _pipeline_inputs(dataset: datasets.Dataset, input_kind: str, text_column_name: str | None = None,
                     text_pair_column_name: str | None = None, image_column_name: str | None = None) -> list[Any]:
    from .run import pipeline_inputs

    if input_kind == "features":
        raise ValueError("--model is a head-only model over feature vectors; predict/evaluate take text or images.")
    column = (image_column_name or "image") if input_kind == "image" else (text_column_name or "text")
    if column not in dataset.column_names:
        raise ValueError(f"--input has no column {column!r} (the model's {input_kind} input); its columns are "
                         f"{dataset.column_names}. Name it with --{input_kind}_column_name.")
    if input_kind == "image":
        return pipeline_inputs(dataset, image_column=column)
    return pipeline_inputs(dataset, column, text_pair_column_name)


def predict_file(model: str, input_path: str, output: str = "predictions.csv", batch_size: int = 32,
                 text_column_name: str | None = None, text_pair_column_name: str | None = None,
                 image_column_name: str | None = None, **pipeline_kwargs: Any) -> int:
    """Writes the deferral pipeline's output for every row of `input_path` to the CSV `output` (see
    [`write_predictions`]); text is truncated where the model was trained (`truncation=True`). Returns the row count.

    Example:

    ```python
    >>> from hf_defer.commands.cli import predict_file
    >>> predict_file("my-deferral-model", "reviews.csv", "decisions.csv")  # doctest: +SKIP
    ```
    """
    from .run import write_predictions

    pipe = _load_pipeline(model)
    inputs = _pipeline_inputs(read_table(input_path), pipe.input_kind, text_column_name, text_pair_column_name,
                              image_column_name)
    if pipe.input_kind == "text":
        pipeline_kwargs.setdefault("truncation", True)
    outputs = pipe(inputs, batch_size=batch_size, **pipeline_kwargs)
    return write_predictions(outputs, output, pipe.model.config.expert_names)


def evaluate_file(model: str, input_path: str, label_column_name: str = "label",
                  expert_column_names: Sequence[str] | None = None, missing_expert: str = "error",
                  batch_size: int = 32, text_column_name: str | None = None,
                  text_pair_column_name: str | None = None, image_column_name: str | None = None) -> dict[str, float]:
    """[`deferral_metrics`] of a saved model on a labelled file; the expert columns default to the model's expert
    names, the classes are matched by name to the model's. The metrics are those of the saved model's pipeline: its
    `expert_costs` and calibrated `defer_threshold` decide, and the budgeted errors rank by the deferral margin as
    [`calibrate_deferral`] does (the numbers `DeferralTrainer.evaluate` reports).

    Example:

    ```python
    >>> from hf_defer.commands.cli import evaluate_file
    >>> evaluate_file("my-deferral-model", "test.csv", expert_column_names=["alice", "bob"])  # doctest: +SKIP
    ```
    """
    from ..data.collator import DataCollatorForDeferral
    from ..evaluation.metrics import deferral_metrics
    from ..data.preparation import prepare_deferral_dataset

    pipe = _load_pipeline(model)
    config = pipe.model.config
    table = read_table(input_path)
    image = pipe.input_kind == "image"
    if image and image_column_name is None:
        image_column_name = "image"
    if not image and text_column_name is None:
        text_column_name = "text"
    if image and isinstance(table.features.get(image_column_name), datasets.Value):
        table = table.cast_column(image_column_name, datasets.Image())  # a column of image paths
    processor = pipe.image_processor if image else pipe.tokenizer
    prepared = prepare_deferral_dataset(
        table, label_column_name, list(expert_column_names or config.expert_names),
        text_column=None if image else text_column_name, text_pair_column=text_pair_column_name,
        image_column=image_column_name if image else None, processor=processor,
        label_names=[config.id2label[k] for k in range(config.num_labels)], missing_expert=missing_expert)
    data = prepared.dataset
    keep = [name for name in data.column_names if name not in ("text", "text_pair")]
    collator = DataCollatorForDeferral(tokenizer=None if image else processor)
    logits, labels, experts = [], [], []
    pipe.model.eval()
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            rows = data[start:start + batch_size]
            rows = [{key: rows[key][i] for key in rows if key in keep or key == "pixel_values"}
                    for i in range(len(rows["labels"]))]
            batch = collator(rows)
            labels.append(batch.pop("labels").numpy())
            experts.append(batch.pop("expert_labels").numpy())
            batch = {key: value.to(pipe.model.device) for key, value in batch.items()}
            logits.append(pipe.model(**batch).logits.float().cpu().numpy())
    return deferral_metrics(np.concatenate(logits), np.concatenate(labels), np.concatenate(experts), pipe.model,
                            budget_ranking="margin")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hf-defer` and `python -m hf_defer`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        from .arguments import parse_run_arguments
        from .run import run_deferral

        model_args, data_args, training_args = parse_run_arguments(rest)
        metrics = run_deferral(model_args, data_args, training_args)
        print(json.dumps({key: value for key, value in metrics.items() if "eval_" in key or "test_" in key}))
        return 0
    parser = argparse.ArgumentParser(prog=f"hf-defer {command}")
    _input_options(parser)
    if command == "predict":
        parser.description = "Writes the deferral pipeline's decision for every row of --input as CSV."
        parser.add_argument("--output", default="predictions.csv", help="CSV to write (default: predictions.csv).")
        parser.add_argument("--expert_costs", default=None, help="Comma-separated cost of asking each expert.")
        parser.add_argument("--defer_threshold", type=float, default=None,
                            help="Deferral margin (default: the calibrated one saved with the model).")
        args = parser.parse_args(rest)
        extra = {"defer_threshold": args.defer_threshold} if args.defer_threshold is not None else {}
        if args.expert_costs:
            extra["expert_costs"] = [float(cost) for cost in args.expert_costs.split(",")]
        count = predict_file(args.model, args.input, args.output, args.batch_size, args.text_column_name,
                             args.text_pair_column_name, args.image_column_name, **extra)
        print(f"wrote {count} decisions to {args.output}")
        return 0
    if command == "evaluate":
        parser.description = "Prints the deferral metrics of a saved model on a labelled file (JSON)."
        parser.add_argument("--label_column_name", default="label", help="Column of the true class (names or ids).")
        parser.add_argument("--expert_column_names", default=None,
                            help="Comma-separated expert columns, in the model's expert order (default: its names).")
        parser.add_argument("--missing_expert", default="error", choices=["error", "drop"],
                            help="What to do with a missing annotation.")
        parser.add_argument("--output", default=None, help="Also write the metrics to this JSON file.")
        args = parser.parse_args(rest)
        experts = [name.strip() for name in args.expert_column_names.split(",")] if args.expert_column_names else None
        metrics = evaluate_file(args.model, args.input, args.label_column_name, experts, args.missing_expert,
                                args.batch_size, args.text_column_name, args.text_pair_column_name,
                                args.image_column_name)
        text = json.dumps(metrics, indent=2)
        print(text)
        if args.output:
            with open(args.output, "w") as handle:
                handle.write(text)
        return 0
    print(f"hf-defer: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
