"""`hf-defer calibrate`: set a saved model's deferral threshold on a calibration file, with a stated confidence."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .evaluate import match_expert_columns
from .inputs import pipeline_inputs, read_table
from .outputs import check_output_file
from .predict import input_column, input_length_limit, load_pipeline, parse_expert_costs
from .promise_flags import parse_rates

__all__ = ["calibrate_file", "parse_rates", "run_calibrate", "write_config_card"]


def calibrate_file(model: str, input_path: str, *, confidence: float | None = None,
                   max_deferral_rate: str | float | None = None, max_error: float | None = None,
                   selective: bool = False, max_mean_cost: float | None = None, expert_costs: str | None = None,
                   label_column_name: str = "label", expert_column_names: Sequence[str] | None = None,
                   missing_expert: str = "error", batch_size: int = 32,
                   text_column_names: Sequence[str] | None = None, text_pair_column_name: str | None = None,
                   image_column_name: str | None = None, text_column_delimiter: str = " ",
                   trust_remote_code: bool = False, unlabeled_path: str | None = None,
                   guarantee: str = "high_probability") -> tuple[Any, dict[str, Any]]:
    """Calibrates the saved model `model` on the file `input_path` ([`calibrate_deferral`]) and returns its pipeline
    (the model's config updated) and a summary: the threshold, the guarantee and the plain-words statement. An error
    target reads the label and the experts' answer columns (matched by name, as `hf-defer evaluate` does).

    Example:

    ```python
    >>> from hf_defer.commands.calibrate import calibrate_file
    >>> pipe, summary = calibrate_file("my-model", "cal.csv", max_error=0.05, confidence=0.9)  # doctest: +SKIP
    ```
    """
    import datasets

    from ..data.preparation import prepare_deferral_dataset
    from ..evaluation.thresholds import calibrate_deferral
    from ..hub.model_card import describe_guarantee
    from ..modeling.guarantee_record import DeferralGuarantee

    if guarantee == "expected":  # the flags that make no sense with it, named as flags, before any model is loaded
        wrong = [flag for flag, given in (("--confidence", confidence is not None),
                                          ("--max_deferral_rate", max_deferral_rate is not None),
                                          ("--max_mean_cost", max_mean_cost is not None), ("--selective", selective))
                 if given]
        if wrong or max_error is None:
            raise ValueError("--guarantee expected promises --max_error alone, on average over calibration draws "
                             "(no --confidence, no budget, not --selective)" + (f"; got {', '.join(wrong)}" if wrong
                             else ": give --max_error") + ". Use --guarantee high_probability for those.")
    table = read_table(input_path)
    pipe = load_pipeline(model, trust_remote_code)
    config = pipe.model.config
    flag_input = f"--input {input_path}"
    table, column = input_column(table, pipe.input_kind, text_column_names, text_column_delimiter, image_column_name,
                                 flag_input)
    image = pipe.input_kind == "image"
    if image and isinstance(table.features[column], datasets.Value):
        table = table.cast_column(column, datasets.Image())  # a column of image paths
    side = [spec["name"] for spec in getattr(config, "side_features", None) or []]
    side_inputs, targets = None, {}
    if side:  # a model with side features reads them from the columns named as them, checked before any pass
        from ..data.preparation import check_side_feature_columns

        absent = [name for name in side if name not in table.column_names]
        if absent:
            raise ValueError(f"the model routes on the side features {side}: {flag_input} lacks the column(s) "
                             f"{absent}; its columns are {table.column_names}.")
        check_side_feature_columns(table, config.side_features, where=f" of {flag_input}")
        side_inputs = pipeline_inputs(table, column, text_pair_column_name, None, side)
    if max_error is not None:  # the labels and the experts' answers, as ids, on the rows kept
        experts = match_expert_columns(expert_column_names, config.expert_names)
        for flag, columns in (("--label_column_name", [label_column_name]), ("--expert_column_names", experts)):
            missing = [name for name in columns if name not in table.column_names]
            if missing:
                raise ValueError(f"{flag}: {missing} not among the columns of {flag_input}, which are "
                                 f"{table.column_names}; name the right ones with {flag}.")
        table = prepare_deferral_dataset(
            table, label_column_name, experts, text_column=None if image else column,
            text_pair_column=text_pair_column_name, image_column=column if image else None,
            label_names=[config.id2label[k] for k in range(config.num_labels)], missing_expert=missing_expert).dataset
        column = column if column in table.column_names else ("image" if image else "text")
        if side_inputs is not None:  # the inputs are the raw rows: the targets must stay aligned with them
            if len(table) != len(side_inputs):
                raise ValueError("--max_error with a model that has side features needs every row: use "
                                 "--missing_expert mask, not drop.")
            rows = table.with_format("numpy")
            targets = {"labels": rows["labels"], "expert_labels": rows["expert_labels"]}
    if column != pipe.input_kind:
        table = table.rename_column(column, pipe.input_kind)
    if text_pair_column_name and text_pair_column_name in table.column_names and text_pair_column_name != "text_pair":
        table = table.rename_column(text_pair_column_name, "text_pair")
    costs = parse_expert_costs(expert_costs, config.expert_names) if expert_costs else None
    options = {} if image else {"truncation": True, "max_length": input_length_limit(pipe)}
    if unlabeled_path is not None:  # the same input columns, read the same way; no labels
        if max_error is None:
            raise ValueError("--unlabeled_file serves --max_error (the prediction-powered test): give --max_error.")
        extra, extra_column = input_column(read_table(unlabeled_path), pipe.input_kind, text_column_names,
                                           text_column_delimiter, image_column_name, f"--unlabeled_file {unlabeled_path}")
        if image and isinstance(extra.features[extra_column], datasets.Value):
            extra = extra.cast_column(extra_column, datasets.Image())
        if not side and extra_column != pipe.input_kind:
            extra = extra.rename_column(extra_column, pipe.input_kind)
        if not side and text_pair_column_name and text_pair_column_name != "text_pair" and \
                text_pair_column_name in extra.column_names:
            extra = extra.rename_column(text_pair_column_name, "text_pair")
        options["unlabeled"] = pipeline_inputs(extra, extra_column, text_pair_column_name, None, side) if side else extra
    threshold = calibrate_deferral(pipe, table if side_inputs is None else side_inputs, max_deferral_rate=parse_rates(max_deferral_rate, config.expert_names)
                                   if isinstance(max_deferral_rate, str) else max_deferral_rate,
                                   batch_size=batch_size, expert_costs=costs, confidence=confidence,
                                   max_error=max_error, selective=selective, max_mean_cost=max_mean_cost, **targets,
                                   **options, **({} if guarantee == "high_probability" else {"guarantee": guarantee}))
    summary = {"defer_threshold": threshold, "deferral_guarantee": config.deferral_guarantee,
               "statement": describe_guarantee(DeferralGuarantee.from_config(config), threshold)}
    return pipe, summary


def write_config_card(model: Any, folder: Path, source: Path | None = None) -> Path | None:
    """Rewrites the deferral model card in ``folder`` from ``model``'s config (threshold, costs, guarantee), so that
    the card describes the config next to it; the license and language of the card in ``source`` (the folder the
    model came from) are kept. The metrics of a former card are dropped: they were measured at another threshold.
    A ``README.md`` that hf_defer did not write is left alone (returns `None`); else returns the card's path."""
    from huggingface_hub import ModelCard

    from ..hub.model_card import DeferralModelCardData, render_model_card

    kept: dict[str, Any] = {}
    for readme in (source / "README.md" if source is not None else None, folder / "README.md"):
        if readme is not None and readme.is_file():
            data = ModelCard.load(readme).data
            kept = {key: getattr(data, key) for key in ("license", "language") if getattr(data, key, None)}
            break
    card = DeferralModelCardData.from_model(model, model_name=folder.resolve().name, **kept)
    try:
        render_model_card(card, folder)
    except FileExistsError:
        return None
    return folder / "README.md"


def run_calibrate(args: argparse.Namespace) -> int:
    """`hf-defer calibrate`: the calibrated threshold and guarantee as JSON on stdout; the model saved with them
    (`--output_dir`, or the `--model` folder itself with `--overwrite`)."""
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be a positive number, got {args.batch_size}.")
    if args.output:
        check_output_file(args.output, [args.input], overwrite=args.overwrite)
    output = Path(args.output_dir or args.model)
    in_place = output.resolve() == Path(args.model).resolve()
    if in_place and not os.path.isdir(args.model):
        raise ValueError(f"--model {args.model} is not a local folder: give --output_dir to save the calibrated model.")
    if output.exists() and any(output.iterdir()) and not args.overwrite:
        other = "--output_dir for a copy" if in_place else "another --output_dir"
        raise ValueError(f"{'--model' if in_place else '--output_dir'} {output} holds a saved model: calibrating "
                         f"changes its config.json; pass --overwrite to replace it (or {other}).")
    names = [name.strip() for name in args.text_column_names.split(",")] if args.text_column_names else None
    experts = [name.strip() for name in args.expert_column_names.split(",")] if args.expert_column_names else None
    pipe, summary = calibrate_file(
        args.model, args.input, confidence=args.confidence, max_deferral_rate=args.max_deferral_rate,
        max_error=args.max_error, selective=args.selective, max_mean_cost=args.max_mean_cost,
        expert_costs=args.expert_costs, label_column_name=args.label_column_name, expert_column_names=experts,
        missing_expert=args.missing_expert, batch_size=args.batch_size, text_column_names=names,
        text_pair_column_name=args.text_pair_column_name, image_column_name=args.image_column_name,
        text_column_delimiter=args.text_column_delimiter, trust_remote_code=args.trust_remote_code,
        unlabeled_path=getattr(args, "unlabeled_file", None), guarantee=getattr(args, "guarantee", "high_probability"))
    if in_place:
        pipe.model.config.save_pretrained(output)  # only config.json changes: the threshold, costs and guarantee
    else:
        pipe.save_pretrained(output, overwrite=args.overwrite)
    card = write_config_card(pipe.model, output, Path(args.model))
    print(f"hf-defer calibrate: the calibrated model is in {output.resolve()}"
          + (f" (config.json and {card.name} rewritten)" if card else " (config.json rewritten; its README.md, not "
             "written by hf_defer, was left as it is: it may describe the former threshold)"), file=sys.stderr)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0
