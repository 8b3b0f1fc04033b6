"""`hf-defer evaluate`: the deferral metrics of a saved model on a labelled file, those of its pipeline."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from .inputs import read_table
from .outputs import check_output_file
from .predict import input_column, input_length_limit, load_pipeline

__all__ = ["evaluate_file", "match_expert_columns", "run_evaluate"]


def match_expert_columns(given: Sequence[str] | None, expert_names: Sequence[str],
                         flag: str = "--expert_column_names") -> list[str]:
    """The answer column of each of the model's experts, in the model's order, matched by name, never by position.

    `given` holds column names that are the experts' names (any order: `bob,alice` for experts `[alice, bob]`), or
    `expert=column` pairs for columns named otherwise; by default each expert's column bears its name. A model with
    one expert takes any one column. An error names `flag`, the command-line flag that gave `given`.

    Example:

    ```python
    >>> from hf_defer.commands.evaluate import match_expert_columns
    >>> match_expert_columns(["bob", "alice"], ["alice", "bob"])
    ['alice', 'bob']
    >>> match_expert_columns(["bob=answers_b", "alice=answers_a"], ["alice", "bob"])
    ['answers_a', 'answers_b']

    ```
    """
    names = list(expert_names)
    if not given:
        return names
    pairs = [item.split("=", 1) if "=" in item else [item, item] for item in given]
    mapping = {expert.strip(): column.strip() for expert, column in pairs}
    if len(names) == 1 and len(given) == 1 and "=" not in given[0]:
        return [mapping.popitem()[1]]
    unknown = [expert for expert in mapping if expert not in names]
    missing = [expert for expert in names if expert not in mapping]
    if unknown or missing or len(mapping) != len(pairs):
        raise ValueError(
            f"{flag} must name one column per expert of the model ({', '.join(names)}), matched by "
            f"name: '{','.join(names)}' for columns named as the experts, or "
            f"'{','.join(f'{name}=<column>' for name in names)}'; got {','.join(given)!r}"
            + (f" (not experts of the model: {unknown})" if unknown else "")
            + (" (an expert named more than once)" if len(mapping) != len(pairs) else "") + ".")
    return [mapping[name] for name in names]


def evaluate_file(model: str, input_path: str, label_column_name: str = "label",
                  expert_column_names: Sequence[str] | None = None, missing_expert: str = "error",
                  batch_size: int = 32, text_column_names: Sequence[str] | str | None = None,
                  text_pair_column_name: str | None = None, image_column_name: str | None = None,
                  text_column_delimiter: str = " ", trust_remote_code: bool = False,
                  expert_correct_columns: Sequence[str] | None = None) -> dict[str, float]:
    """[`deferral_metrics`] of a saved model on a labelled file. The expert columns are matched to the model's experts
    by name ([`match_expert_columns`]), the classes by name to the model's. The metrics are those of the saved model's
    pipeline: its `expert_costs` and calibrated `defer_threshold` decide, text is truncated where its saved
    tokenizer says, and the budgeted errors rank by the deferral margin as [`calibrate_deferral`] does (the numbers
    `DeferralTrainer.evaluate` reports). A route-only model (no classes) is scored on its experts' correctness or
    scores instead, one column per expert (`expert_correct_columns`, matched by name the same way; by default the
    columns named as its experts), with no label column.

    Example:

    ```python
    >>> from hf_defer.commands.evaluate import evaluate_file
    >>> evaluate_file("my-deferral-model", "test.csv", expert_column_names=["alice", "bob"])  # doctest: +SKIP
    ```
    """
    import datasets
    import numpy as np
    import torch

    from ..data.collator import DataCollatorForDeferral
    from ..data.preparation import prepare_deferral_dataset
    from ..evaluation.metrics import deferral_metrics
    from ..modeling.surrogate_routing import is_route_only

    if isinstance(text_column_names, str):
        text_column_names = [text_column_names]
    table = read_table(input_path)
    pipe = load_pipeline(model, trust_remote_code)
    config = pipe.model.config
    route_only = is_route_only(config)
    if route_only and expert_column_names:
        raise ValueError("--expert_column_names: a route-only model has no classes, so no expert answers to compare "
                         "with a label; give each expert's correctness (0/1) or score with --expert_correct_columns.")
    if not route_only and expert_correct_columns:
        raise ValueError("--expert_correct_columns is for route-only models; this model has classes: give the "
                         "experts' answers with --expert_column_names and the true class with --label_column_name.")
    flag = "--expert_correct_columns" if route_only else "--expert_column_names"
    experts = match_expert_columns(expert_correct_columns if route_only else expert_column_names,
                                   config.expert_names, flag)
    flag_input = f"--input {input_path}"
    needed = [(flag, experts)] if route_only else [("--label_column_name", [label_column_name]), (flag, experts)]
    for flag, columns in needed:
        missing = [column for column in columns if column not in table.column_names]
        if missing:
            raise ValueError(f"{flag}: {missing} not among the columns of {flag_input}, which are "
                             f"{table.column_names}; name the right ones with {flag}.")
    image = pipe.input_kind == "image"
    table, column = input_column(table, pipe.input_kind, text_column_names, text_column_delimiter, image_column_name,
                                 flag_input)
    if image and isinstance(table.features[column], datasets.Value):
        table = table.cast_column(column, datasets.Image())  # a column of image paths
    processor = pipe.image_processor if image else pipe.tokenizer
    targets = {"expert_correct_columns": experts} if route_only else {
        "label_column": label_column_name, "expert_columns": experts,
        "label_names": [config.id2label[k] for k in range(config.num_labels)]}
    prepared = prepare_deferral_dataset(
        table, **({"label_column": None} | targets), text_column=None if image else column,
        text_pair_column=text_pair_column_name, image_column=column if image else None, processor=processor,
        max_length=None if image else input_length_limit(pipe), missing_expert=missing_expert,
        side_feature_columns=getattr(config, "side_features", None) or ())  # the model's, read from their columns
    data = prepared.dataset
    keep = [name for name in data.column_names if name not in ("text", "text_pair")]
    collator = DataCollatorForDeferral(tokenizer=None if image else processor)
    names = ["expert_correct"] if route_only else ["labels", "expert_labels"]
    logits, gathered = [], {name: [] for name in names}
    pipe.model.eval()
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            rows = data[start:start + batch_size]
            rows = [{key: rows[key][i] for key in rows if key in keep or key == "pixel_values"}
                    for i in range(len(rows[names[0]]))]
            batch = collator(rows)
            for name in names:
                gathered[name].append(batch.pop(name).numpy())
            batch = {key: value.to(pipe.model.device) for key, value in batch.items()}
            logits.append(pipe.model(**batch).logits.float().cpu().numpy())
    targets = {name: np.concatenate(values) for name, values in gathered.items()}
    if route_only:
        return deferral_metrics(np.concatenate(logits), None, None, pipe.model, budget_ranking="margin",
                                expert_correct=targets["expert_correct"])
    return deferral_metrics(np.concatenate(logits), targets["labels"], targets["expert_labels"], pipe.model,
                            budget_ranking="margin")


def run_evaluate(args: argparse.Namespace) -> int:
    """`hf-defer evaluate`: the metrics as JSON on stdout (and in `--output`)."""
    if args.output:
        check_output_file(args.output, [args.input], overwrite=args.overwrite)
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be a positive number, got {args.batch_size}.")
    names = [name.strip() for name in args.text_column_names.split(",")] if args.text_column_names else None
    experts = [name.strip() for name in args.expert_column_names.split(",")] if args.expert_column_names else None
    correct = ([name.strip() for name in args.expert_correct_columns.split(",")] if args.expert_correct_columns
               else None)
    metrics: Any = evaluate_file(args.model, args.input, args.label_column_name, experts, args.missing_expert,
                                 args.batch_size, names, args.text_pair_column_name, args.image_column_name,
                                 args.text_column_delimiter, args.trust_remote_code, correct)
    text = json.dumps(metrics, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 0
