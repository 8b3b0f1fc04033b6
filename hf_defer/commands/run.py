"""Train, evaluate, calibrate, save and predict from a user's data: what `scripts/run_deferral.py` and
`hf-defer train` run.

[`run_deferral`] follows transformers' `run_classification.py`: log levels from `TrainingArguments`, load the data
(Hub dataset or files), check and prepare it ([`prepare_deferral_dataset`]), build the model around the encoder, train
and evaluate with [`DeferralTrainer`] (`trainer.save_metrics`, `trainer.save_state`), calibrate a deferral budget,
save a Hub-ready folder, write `predictions.csv`, push to the Hub. All data checks run before the model is loaded, and
the output folder is checked before anything is written. It runs unchanged under `accelerate launch` and `torchrun`.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import transformers
from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback

from .arguments import DataTrainingArguments, ModelArguments
from .inputs import check_splits, join_text_columns, load_raw_datasets, pipeline_inputs, split_sources
from .outputs import RUN_SUMMARY, OutputFolder, format_summary, stage_metrics, write_predictions
from .run_checks import check_stages, default_stages, first_line, hub_repository_error
from ..evaluation.thresholds import calibrate_deferral
from ..modeling.configuration_deferral import DeferralConfig
from ..experts.embeddings import head_on_sentence_encoder, sentence_encoder_max_length, sentence_encoder_pooling
from ..experts.simulated import annotator_expert, class_subset_expert
from ..hub.model_source import resolve_model_name
from ..hub.sharing import push_to_hub, save_for_hub
from ..modeling.modeling_deferral import EncoderForDeferral, EncoderForRouting
from ..modeling.surrogate_routing import is_route_only
from ..data.preparation import check_side_feature_columns, prepare_deferral_dataset
from ..training.trainer import DeferralTrainer

__all__ = ["load_raw_datasets", "pipeline_inputs", "run_deferral", "write_predictions"]

logger = logging.getLogger(__name__)

STAGES = ("train", "eval", "calibrated_eval", "test")
"""The metrics of a run, by when they were taken: `eval` on the validation split before calibrating the deferral
budget, `calibrated_eval` on it after, `test` with the saved model (after calibration)."""


def setup_logging(training_args: TrainingArguments) -> None:
    """Log levels as transformers' example scripts set them: `--log_level` (and `--log_level_replica`) for this
    module, transformers and datasets, then a one-line summary of the process (at INFO). Logs go to stderr."""
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stderr)])
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.info(f"Process rank: {training_args.process_index}, device: {training_args.device}, n_gpu: "
                   f"{training_args.n_gpu}, distributed training: {training_args.parallel_mode.value == 'distributed'}"
                   f", 16-bits training: {training_args.fp16 or training_args.bf16}")
    logger.info(f"Training/evaluation parameters {training_args}")


def _simulate_expert(raw: datasets.DatasetDict, data_args: DataTrainingArguments) -> datasets.DatasetDict:
    """Adds the column `data_args.simulated_expert` holding a simulated expert's answers, per split (own seed)."""
    column, label = data_args.simulated_expert, data_args.label_column_name
    labelled = [dataset for dataset in raw.values() if label in dataset.column_names]
    out = {}
    for index, (split, dataset) in enumerate(raw.items()):
        if label not in dataset.column_names:
            if split == "test":  # an unlabelled test file: predictions only
                out[split] = dataset
                continue
            raise ValueError(f"label column {label!r} not found in split {split!r}; its columns are "
                             f"{dataset.column_names}.")
        seed = data_args.expert_seed + index
        if column == "annotator":
            out[split] = annotator_expert(dataset, data_args.count_columns, seed=seed, column=column)
            continue
        feature = dataset.features[label]
        if isinstance(feature, datasets.ClassLabel):
            num_classes = feature.num_classes
        elif isinstance(feature, datasets.Value) and feature.dtype.startswith("int"):
            num_classes = max(max(part[label][:]) for part in labelled) + 1
        else:
            raise ValueError(f"--simulated_expert class_subset needs class ids in {label!r} (a ClassLabel or int "
                             f"column), got {feature}.")
        out[split] = class_subset_expert(dataset, num_classes, data_args.expert_k, data_args.expert_p, seed=seed,
                                         label_column=label, column=column)
    return datasets.DatasetDict(out)


def _input_columns(raw: datasets.DatasetDict, data_args: DataTrainingArguments,
                   sources: dict[str, str]) -> tuple[datasets.DatasetDict, str | None, str | None]:
    """The splits and their text and image columns: as given (several text columns joined into one), else the first
    column of images, else `text`."""
    columns = data_args.text_columns
    if columns and data_args.image_column_name:
        raise ValueError(f"give --text_column_names or --image_column_name, not both (got {data_args.text_column_names!r}"
                         f" and {data_args.image_column_name!r}).")
    if columns:
        for split, dataset in raw.items():
            missing = [column for column in columns if column not in dataset.column_names]
            if missing:
                raise ValueError(f"--text_column_names {','.join(missing)!r} is not a column of split {split!r} "
                                 f"({sources.get(split, split)}); its columns are {dataset.column_names}. Add the "
                                 "column or name the right one with --text_column_names.")
        joined = {split: join_text_columns(dataset, columns, data_args.text_column_delimiter)
                  for split, dataset in raw.items()}
        return datasets.DatasetDict({split: pair[0] for split, pair in joined.items()}), \
            next(iter(joined.values()))[1], None
    if data_args.image_column_name:
        return raw, None, data_args.image_column_name
    features = next(iter(raw.values())).features
    images = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    if images:
        return raw, None, images[0]
    if "text" in features:
        return raw, "text", None
    raise ValueError(f"give --text_column_names or --image_column_name; the data's columns are {list(features)}.")


def with_lora(model: EncoderForDeferral, model_args: ModelArguments) -> Any:
    """``model`` with LoRA adapters on its encoder (`peft.get_peft_model`) and its deferral head trained in full."""
    if model.encoder is None:
        raise ValueError("--use_lora needs an encoder to adapt; with --freeze_encoder on text only a head is trained.")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ImportError("--use_lora needs peft: pip install 'hf-defer[peft]'.") from None
    trained = ["head"] + (["side"] if model.side is not None else [])  # side features' embeddings train in full
    config = LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout,
                        target_modules=model_args.lora_targets, modules_to_save=trained)
    return get_peft_model(model, config)


def _hub_kwargs(model_args: ModelArguments) -> dict[str, Any]:
    """`--cache_dir`, `--model_revision`, `--token`, `--trust_remote_code` as `from_pretrained` keywords."""
    kwargs = {"cache_dir": model_args.cache_dir, "revision": model_args.model_revision, "token": model_args.token,
              "trust_remote_code": model_args.trust_remote_code}
    return {key: value for key, value in kwargs.items() if value is not None}


def _tokenize(splits: datasets.DatasetDict, tokenizer: Any, data_args: DataTrainingArguments,
              pair: bool) -> datasets.DatasetDict:
    """Tokenizes `text` (and `text_pair`), truncating at `--max_seq_length`, with `--preprocessing_num_workers`
    processes; `--overwrite_cache` redoes it instead of reading the `datasets` cache."""
    max_length = data_args.max_seq_length

    def tokenize(batch: dict[str, list]) -> Any:
        return tokenizer(batch["text"], batch["text_pair"] if pair else None, truncation=True, max_length=max_length)

    return splits.map(tokenize, batched=True, num_proc=data_args.preprocessing_num_workers,
                      load_from_cache_file=not data_args.overwrite_cache, desc="Running tokenizer on dataset")


def _complete_rows(split: datasets.Dataset, label: str | None, expert_columns: list[str],
                   data_args: DataTrainingArguments) -> list[int]:
    """The rows of ``split`` that `--missing_expert drop` keeps (every expert answered), by the preparation's own rule:
    calibration then uses the rows the metrics are scored on."""
    marked = prepare_deferral_dataset(split.select_columns([column for column in split.column_names if column in (
        [label] if label is not None else []) + list(expert_columns) + list(data_args.correct_columns)]), label,
        expert_columns, label_names=data_args.classes, missing_expert="mask",
        expert_correct_columns=data_args.correct_columns).dataset.with_format("numpy")
    targets = marked["expert_correct" if "expert_correct" in marked.column_names else "expert_labels"]
    targets = np.asarray(targets).reshape(len(split), -1)
    return np.flatnonzero((targets != -100).all(axis=1)).tolist()


def majority_class_warning(metrics: dict[str, Any], stage: str) -> str | None:
    """A warning when the classifier's error on a stage is no better than always answering the majority class."""
    error, baseline = metrics.get(f"{stage}_classifier_error"), metrics.get(f"{stage}_majority_class_error")
    if error is None or baseline is None or error < baseline:
        return None
    return (f"{stage}: the classifier errs {error:.4f}, no better than always answering the most frequent class "
            f"({baseline:.4f}): it has learned nothing usable. Train longer or with a larger --learning_rate, or "
            "check the labels.")


def _record(trainer: DeferralTrainer, stage: str, metrics: dict[str, float], results: dict[str, float]) -> None:
    """Saves the metrics of a stage as the Trainer does (`<stage>_results.json`, `all_results.json`), and warns when
    the classifier does no better than the majority class; the run prints the metrics once, at the end, in one table
    ([`format_metrics_table`])."""
    baseline = majority_class_warning(metrics, stage) if stage != "calibrated_eval" else None  # eval's classifier
    if baseline:
        logger.warning(baseline)
    trainer.save_metrics(stage, metrics)
    results.update(metrics)


class TrainingLogPrinter(PrinterCallback):
    """The Trainer's `PrinterCallback` (its log lines when `--disable_tqdm`) without the logs of `trainer.evaluate`
    after training: the run prints those metrics once, in its table ([`format_metrics_table`])."""

    def on_log(self, args: TrainingArguments, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        evaluation = any(key.startswith(("eval_", "calibrated_eval_", "test_")) for key in logs or {})
        if not evaluation or state.global_step < state.max_steps:  # an evaluation during training: its own numbers
            super().on_log(args, state, control, logs=logs, **kwargs)


_BOOKKEEPING = ("runtime", "per_second", "samples", "epoch", "flos")
"""Metric names ending so are the Trainer's bookkeeping: kept in the JSON files, not in the printed table."""


def format_metrics_table(metrics: dict[str, dict[str, float]]) -> str:
    """The metrics of the evaluated stages as one table, each number once: a row per metric, a column per stage
    (`eval`: the validation split before calibrating, `calibrated_eval`: after, `test`: the saved model); the
    training loss and times are the Trainer's own log line. Empty when no stage was evaluated.

    Example:

    ```python
    >>> from hf_defer.commands.run import format_metrics_table
    >>> print(format_metrics_table({"eval": {"system_error": 0.25, "runtime": 0.1}, "test": {"system_error": 0.3,
    ...                                                                                   "coverage": 0.5}}))
    Metrics: eval = validation split, test = saved model
                    eval    test
      system_error  0.2500  0.3000
      coverage              0.5000

    ```
    """
    stages = [stage for stage in STAGES if stage != "train" and metrics.get(stage)]
    names: list[str] = []
    for stage in stages:
        names += [name for name in metrics[stage] if name not in names and not name.endswith(_BOOKKEEPING)]
    if not names:
        return ""
    meaning = {"eval": "eval = validation split", "calibrated_eval": "calibrated_eval = after calibrating",
               "test": "test = saved model"}
    width = max(map(len, names))
    columns = [max(len(stage), 6) for stage in stages]

    def cell(value: Any, size: int) -> str:
        text = "" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
        return f"{text:<{size}}"

    lines = ["Metrics: " + ", ".join(meaning[stage] for stage in stages),
             " " * (width + 4) + "  ".join(cell(stage, size) for stage, size in zip(stages, columns))]
    for name in names:
        lines.append(f"  {name:<{width}}  " + "  ".join(cell(metrics[stage].get(name), size)
                                                       for stage, size in zip(stages, columns)))
    return "\n".join(line.rstrip() for line in lines)


def run_deferral(model_args: ModelArguments, data_args: DataTrainingArguments,
                 training_args: TrainingArguments) -> dict[str, float]:
    """Runs what the flags ask and saves a Hub-ready folder to `--output_dir`.

    In order: check `--output_dir` ([`OutputFolder`]: files no hf_defer run or save wrote stop the run unless
    `--overwrite_output_dir`); load the splits ([`load_raw_datasets`]); add a simulated expert if asked; check every
    split, test included ([`check_splits`]), and prepare them ([`prepare_deferral_dataset`]): all data errors come
    here, before any model is loaded; build the model (with `--freeze_encoder` on text: a head on cached sentence
    embeddings of at most `--max_seq_length` tokens, later put on the encoder with the same pooling); `--do_train`;
    `--do_eval` (validation, metrics `eval_*`); `--max_deferral_rate`: calibrate the pipeline's threshold on the
    validation inputs with the pipeline's own tokenizer settings, then evaluate again (`calibrated_eval_*`);
    `--do_predict` (`test_*` when the test split is labelled: the saved model's numbers); save model, processor
    (truncating at `--max_seq_length`), code and card; write `predictions.csv` for every test row; write
    `hf_defer_run.json` and print a summary; `--push_to_hub`: upload the folder.

    Before anything is loaded: `--do_eval` / `--do_predict` without `--do_train` are refused ([`check_stages`]: the
    head would be untrained), and the model's name must be a folder here or a Hub id that can be loaded
    ([`resolve_model_name`]). With no stage flag, the run trains, evaluates and predicts on the splits it has
    ([`default_stages`]). `hf_defer_run.json` ends `completed`, or `failed` with the error, or `interrupted`; an upload
    that fails leaves the saved folder and ends in a `ConnectionError` that names it.

    Args:
        model_args ([`ModelArguments`]): the model, tokenizer and surrogate flags, as [`parse_run_arguments`] returns
            them.
        data_args ([`DataTrainingArguments`]): the data flags (files, columns, `--max_deferral_rate`, ...).
        training_args (`transformers.TrainingArguments`): the Trainer's flags (`--output_dir`, the stages, ...).

    Returns:
        `dict[str, float]`: the metrics of every stage with their prefixes (`train_`, `eval_`, `calibrated_eval_`,
        `test_`, as in `all_results.json`) and, when calibrated, `defer_threshold`.

    Example:

    ```python
    >>> from hf_defer.commands.arguments import parse_run_arguments
    >>> from hf_defer.commands.run import run_deferral
    >>> metrics = run_deferral(*parse_run_arguments([  # doctest: +SKIP
    ...     "--model_name_or_path", "sentence-transformers/all-MiniLM-L6-v2", "--train_file", "train.csv",
    ...     "--validation_file", "dev.csv", "--expert_column_names", "alice,bob", "--do_train", "--do_eval",
    ...     "--output_dir", "my-deferral-model"]))
    ```
    """
    setup_logging(training_args)
    output = OutputFolder(training_args.output_dir, overwrite=data_args.overwrite_output_dir)
    output.check()  # every process, before anything is written
    check_stages(training_args)
    for flag in ("model_name_or_path", "config_name", "tokenizer_name"):
        if getattr(model_args, flag):  # a mistyped folder fails now, not after the data or a minute of Hub retries;
            # offline, the shipped MiniLM: the resolution the Python API uses (hf_defer.hub.resolve_model_name)
            setattr(model_args, flag, resolve_model_name(getattr(model_args, flag), f"--{flag}", model_args.token,
                                                         model_args.model_revision, model_args.cache_dir))
    with output.recording():  # hf_defer_run.json says how the run ended: completed, failed (and why) or interrupted
        return _run_deferral(model_args, data_args, training_args, output)


@dataclass
class _RunData:
    """A run's splits once loaded, checked and prepared, with the columns and processor they were read with."""

    raw: datasets.DatasetDict  # the splits as loaded, text columns joined (the test split may be unlabelled)
    splits: datasets.DatasetDict  # the prepared splits (tokenized, or with sentence embeddings for a frozen text model)
    sources: dict[str, str]  # where each split comes from, for error messages
    expert_columns: list[str]
    text_column: str | None
    image_column: str | None
    processor: Any  # the tokenizer or image processor
    processor_path: str  # where the processor comes from (for a frozen text model, its sentence encoder)
    frozen_text: bool  # --freeze_encoder on text: a head on cached sentence embeddings
    model_kwargs: dict[str, Any]  # the model's classes, experts and side features, as the preparation found them


def _load_splits(model_args: ModelArguments, data_args: DataTrainingArguments,
                 training_args: TrainingArguments) -> datasets.DatasetDict:
    """Loads the splits (holding out a validation split where evaluating or calibrating needs one) and settles the
    stages they allow."""
    uses = [use for needed, use in ((training_args.do_eval, "evaluation (--do_eval, --eval_strategy)"),
                                    (data_args.max_deferral_rate is not None,
                                     "calibrating the deferral threshold (--max_deferral_rate)")) if needed]
    raw = load_raw_datasets(data_args, training_args.seed, model_args, hold_out_for=" and ".join(uses) or None)
    default_stages(training_args, raw)
    if training_args.do_predict and "test" not in raw:  # as run_classification.py: not a silent run without it
        raise ValueError("--do_predict requires a test dataset: give --test_file (or a --dataset_name with a "
                         "'test' split), or drop --do_predict.")
    return raw


def _check_side_columns(raw: datasets.DatasetDict, data_args: DataTrainingArguments, image_column: str | None,
                        sources: dict[str, str]) -> None:
    """Refuses side features beside an image, and side feature columns missing from any split (test included)."""
    side = data_args.side_features
    if side and image_column is not None:
        raise ValueError("--side_feature_columns is for text (and feature) models; the pipeline takes no side "
                         f"features beside an image (--image_column_name {image_column!r}).")
    for split, dataset in raw.items():  # the test split too: predictions.csv reads them
        absent = [column for column in side if column not in dataset.column_names]
        if absent:
            raise ValueError(f"--side_feature_columns {absent} not among the columns of split {split!r} "
                             f"({sources.get(split, split)}), which are {dataset.column_names}.")


def _check_test_columns(raw: datasets.DatasetDict, data_args: DataTrainingArguments, sources: dict[str, str]) -> None:
    """Refuses an `--id_column_name` or `--copy_columns` that the test split lacks, before training."""
    if "test" not in raw:
        return
    test_columns = raw["test"].column_names  # the columns predictions.csv copies
    for flag, columns in (("--id_column_name", [data_args.id_column_name] if data_args.id_column_name else []),
                          ("--copy_columns", data_args.copied_columns)):
        missing = [column for column in columns if column not in test_columns]
        if missing:
            raise ValueError(f"{flag} {missing} not among the columns of split 'test' ({sources['test']}), "
                             f"which are {test_columns}.")


def _load_processor(model_args: ModelArguments, image_column: str | None,
                    hub: dict[str, Any]) -> tuple[Any, str, bool]:
    """The tokenizer or image processor, where it comes from, and whether the run trains a head on frozen sentence
    embeddings (`--freeze_encoder` on text)."""
    frozen_text = model_args.freeze_encoder and image_column is None
    processor_path = model_args.tokenizer_name or model_args.model_name_or_path
    if frozen_text:
        from ..experts.embeddings import resolve_sentence_encoder

        processor_path = resolve_sentence_encoder(model_args.model_name_or_path)
    processor = (AutoImageProcessor if image_column else AutoTokenizer).from_pretrained(processor_path, **hub)
    return processor, processor_path, frozen_text


def _prepare_splits(raw: datasets.DatasetDict, data_args: DataTrainingArguments, expert_columns: list[str],
                    text_column: str | None, image_column: str | None, processor: Any,
                    sources: dict[str, str]) -> tuple[datasets.DatasetDict, dict[str, Any]]:
    """The labelled splits prepared for the model ([`prepare_deferral_dataset`]) and the model's keywords they give;
    an unlabelled test split's side features checked by the same rule."""
    label, side = data_args.label_column_name, data_args.side_features
    targets = [label] if label is not None else data_args.correct_columns  # route-only: correctness alone
    labelled = datasets.DatasetDict({split: part for split, part in raw.items()  # a test file may be unlabelled
                                     if split != "test" or set(targets) <= set(part.column_names)})
    prepared = prepare_deferral_dataset(
        labelled, label, expert_columns, text_column=text_column,
        text_pair_column=data_args.text_pair_column_name, image_column=image_column,
        processor=processor if image_column else None, max_length=data_args.max_seq_length,
        label_names=data_args.classes, missing_expert=data_args.missing_expert,
        expert_correct_columns=data_args.correct_columns, side_feature_columns=side,
        categorical_side_features=data_args.categorical_side_features, side_feature_dim=data_args.side_feature_dim)
    if side and "test" in raw and "test" not in labelled:  # an unlabelled test file: its values checked here
        check_side_feature_columns(raw["test"], prepared.side_features, where=f" of split 'test' ({sources['test']})")
    names = prepared.model_kwargs()
    if data_args.route_only and data_args.default_expert is not None:
        names["default_expert"] = data_args.default_expert
    return prepared.dataset, names


def _load_and_prepare(model_args: ModelArguments, data_args: DataTrainingArguments,
                      training_args: TrainingArguments, hub: dict[str, Any]) -> _RunData:
    """Loads the splits, adds a simulated expert if asked, checks every column the run reads and prepares the splits:
    every data error comes here, before any model is loaded."""
    label = data_args.label_column_name
    raw = _load_splits(model_args, data_args, training_args)
    sources = split_sources(data_args)
    expert_columns, expert_flag = data_args.expert_columns, "--expert_column_names"
    if data_args.simulated_expert:
        raw, expert_columns = _simulate_expert(raw, data_args), [data_args.simulated_expert]
        expert_flag = "--simulated_expert"
    raw, text_column, image_column = _input_columns(raw, data_args, sources)
    inputs = {flag: column for flag, column in (("--text_column_names", text_column),
                                                ("--text_pair_column_name", data_args.text_pair_column_name),
                                                ("--image_column_name", image_column)) if column is not None}
    check_splits(raw, sources, inputs, ([("--label_column_name", label)] if label is not None else [])
                 + [(expert_flag, column) for column in expert_columns]
                 + [("--expert_correct_columns", column) for column in data_args.correct_columns])
    _check_side_columns(raw, data_args, image_column, sources)
    _check_test_columns(raw, data_args, sources)
    processor, processor_path, frozen_text = _load_processor(model_args, image_column, hub)
    splits, names = _prepare_splits(raw, data_args, expert_columns, text_column, image_column, processor, sources)
    if text_column is not None and not frozen_text:
        splits = _tokenize(splits, processor, data_args, data_args.text_pair_column_name is not None)
    return _RunData(raw=raw, splits=splits, sources=sources, expert_columns=expert_columns, text_column=text_column,
                    image_column=image_column, processor=processor, processor_path=processor_path,
                    frozen_text=frozen_text, model_kwargs=names)


def _log_training_samples(splits: datasets.DatasetDict, training_args: TrainingArguments) -> None:
    """Logs 3 random rows of the prepared training split (at INFO), as transformers' example scripts do."""
    if "train" in splits and training_args.do_train:
        for index in random.Random(training_args.seed).sample(range(len(splits["train"])),
                                                             min(3, len(splits["train"]))):
            logger.info(f"Sample {index} of the training set: {splits['train'][index]}.")


def _head_on_embeddings(model_args: ModelArguments, training_args: TrainingArguments, data: _RunData,
                        max_length: int) -> tuple[EncoderForDeferral | EncoderForRouting, datasets.DatasetDict, int]:
    """`--freeze_encoder` on text: a deferral head over the sentence encoder's embeddings of each split, the splits
    with those embeddings, and the length the encoder cuts at."""
    pooling, normalize = sentence_encoder_pooling(data.processor_path)
    if model_args.pooling not in (None, pooling) or (model_args.normalize_pooled and not normalize):
        raise ValueError(f"--freeze_encoder trains on {data.processor_path}'s sentence embeddings ({pooling} pooling"
                         f"{', normalized' if normalize else ''}); drop --pooling / --normalize_pooled.")
    from ..experts.embeddings import add_embeddings

    max_length = min(max_length, sentence_encoder_max_length(data.processor_path) or max_length)
    with training_args.main_process_first(desc="sentence embeddings"):  # the saved tokenizer cuts here too
        splits = add_embeddings(data.splits, data.processor_path, cache_dir=model_args.embedding_cache_dir,
                                show_progress_bar=not training_args.disable_tqdm, max_seq_length=max_length)
    width = len(splits["train" if "train" in splits else "validation"][0]["features"])
    config = DeferralConfig(feature_size=width, surrogate=model_args.surrogate, **data.model_kwargs)
    return (EncoderForRouting if is_route_only(config) else EncoderForDeferral)(config), splits, max_length


def _encoder_model(model_args: ModelArguments, data: _RunData, hub: dict[str, Any]) -> EncoderForDeferral:
    """The deferral model around the pretrained encoder (`--config_name`, `--pooling`, `--freeze_encoder`)."""
    encoder_kwargs = dict(hub)
    if model_args.config_name:
        encoder_kwargs["config"] = AutoConfig.from_pretrained(model_args.config_name, **hub)
    return EncoderForDeferral.from_encoder_pretrained(
        model_args.model_name_or_path, encoder_kwargs=encoder_kwargs, surrogate=model_args.surrogate,
        pooling=model_args.pooling, normalize_pooled=model_args.normalize_pooled,
        freeze_encoder=model_args.freeze_encoder, **data.model_kwargs)


def _check_hub_repository(repo_id: str, training_args: TrainingArguments) -> None:
    """`--push_to_hub` to a repository that cannot be reached: warns, and trains and saves here without checkpoint
    uploads (the upload is tried again at the end)."""
    if training_args.push_to_hub and training_args.process_index == 0:  # the Trainer would create the repository
        unreachable = hub_repository_error(repo_id, training_args)
        if unreachable:
            logger.warning(f"--push_to_hub: {unreachable}; training goes on and saves the model to "
                           f"{Path(training_args.output_dir).resolve()}, and the upload is tried again at the end.")
            training_args.push_to_hub = False  # no checkpoint uploads during training


def _make_trainer(model: Any, training_args: TrainingArguments, data: _RunData) -> DeferralTrainer:
    """The [`DeferralTrainer`] on the training and validation splits the stages use; with `--disable_tqdm`, its log
    lines without the metrics the run's table prints."""
    trainer = DeferralTrainer(
        model=model, args=training_args, processing_class=None if data.frozen_text else data.processor,
        train_dataset=data.splits.get("train") if training_args.do_train else None,
        eval_dataset=data.splits.get("validation") if training_args.do_eval else None)
    if training_args.disable_tqdm:  # the Trainer's log lines without the metrics the run's table prints once
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(TrainingLogPrinter)
    return trainer


def _train_and_evaluate(trainer: DeferralTrainer, training_args: TrainingArguments, splits: datasets.DatasetDict,
                        results: dict[str, float]) -> str | None:
    """`--do_train` (metrics `train_*`, the Trainer's state saved) and `--do_eval` (`eval_*`); the warning to give at
    the end when training did not move the loss."""
    flat = None
    if training_args.do_train:
        from ..training.loss_check import flat_loss_warning, probe_loss

        before = probe_loss(trainer, splits["train"])
        trained = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        flat = flat_loss_warning(before, probe_loss(trainer, splits["train"]), training_args.learning_rate)
        _record(trainer, "train", {**trained.metrics, "train_samples": len(splits["train"]),
                                   "train_steps": trained.global_step}, results)
        trainer.save_state()
    if training_args.do_eval:
        _record(trainer, "eval", {**trainer.evaluate(), "eval_samples": len(splits["validation"])}, results)
    return flat


def _final_model(model: Any, model_args: ModelArguments, trainer: DeferralTrainer, data: _RunData) -> Any:
    """The model to calibrate, save and predict with: LoRA adapters merged, a frozen text head put on its encoder."""
    final = model
    if model_args.use_lora:  # adapters merged into the encoder: a plain deferral model that saves and loads as any
        final = model.merge_and_unload()
        trainer.model = trainer.model_wrapped = final
    if data.frozen_text:  # the head goes on the encoder: mean/cls pooling (+ normalization) reproduces the embeddings
        final = head_on_sentence_encoder(model, data.processor_path)
    final.eval()
    return final


def _calibrate_threshold(final: Any, data: _RunData, data_args: DataTrainingArguments,
                         training_args: TrainingArguments, columns: tuple[Any, ...],
                         call_kwargs: dict[str, Any]) -> float:
    """The pipeline's threshold calibrated on the validation inputs ([`calibrate_deferral`]) for `--max_deferral_rate`
    and the promises asked (`--max_error`, `--max_mean_cost`, `--confidence`); under `--missing_expert drop`, on the
    rows the metrics score."""
    promises = {"confidence": data_args.confidence, "max_error": data_args.max_error,
                "selective": data_args.selective, "max_mean_cost": data_args.max_mean_cost}
    splits, raw = data.splits, data.raw
    if data_args.max_error is not None and not data_args.route_only:  # the labels and answers the model reads
        if len(splits["validation"]) != len(raw["validation"]):
            raise ValueError("--max_error needs every validation row: use --missing_expert mask, not drop.")
        rows = splits["validation"].with_format("numpy")
        promises.update(labels=rows["labels"], expert_labels=rows["expert_labels"])
    calibration = raw["validation"]
    if len(splits["validation"]) != len(calibration):  # --missing_expert drop: the rows the metrics score
        calibration = calibration.select(_complete_rows(calibration, data_args.label_column_name, data.expert_columns,
                                                        data_args))
        logger.warning(f"--missing_expert drop: the deferral budget is calibrated on the {len(calibration)} of "
                       f"{len(raw['validation'])} validation rows with every answer, the rows the metrics score.")
    processor, image = data.processor, data.image_column
    return calibrate_deferral(final, pipeline_inputs(calibration, *columns), data_args.max_deferral_rate,
                              batch_size=training_args.per_device_eval_batch_size,
                              tokenizer=None if image else processor, image_processor=processor if image else None,
                              **promises, **call_kwargs)


def _card_data(trainer: DeferralTrainer, model_args: ModelArguments, data_args: DataTrainingArguments,
               final: Any, repo_id: str, image_column: str | None, results: dict[str, float]) -> Any:
    """The model card's data: the Trainer's, with the run's base model, name, input kind, threshold and data set."""
    return trainer.model_card_data(base_model=model_args.model_name_or_path, model_name=repo_id.split("/")[-1],
                                   input_kind="image" if image_column else "text",
                                   defer_threshold=float(final.config.defer_threshold),
                                   dataset_id=data_args.dataset_name, license=model_args.license,
                                   language=[code.strip() for code in model_args.language.split(",")]
                                   if model_args.language else None,
                                   dataset_split="test" if "test_system_error" in results else "validation")


def _write_test_predictions(final: Any, data: _RunData, data_args: DataTrainingArguments,
                            training_args: TrainingArguments, folder: Path, columns: tuple[Any, ...],
                            call_kwargs: dict[str, Any]) -> tuple[Path, int]:
    """Runs the saved model's pipeline on every test row and writes `predictions.csv`; its path and row count."""
    from transformers import pipeline

    from .predict import run_pipeline

    image = data.image_column
    pipe = pipeline("deferral", model=final, tokenizer=None if image else data.processor,
                    image_processor=data.processor if image else None, device=final.device)
    test = data.raw["test"]
    outputs = run_pipeline(pipe, pipeline_inputs(test, *columns), training_args.per_device_eval_batch_size,
                           disable_progress_bar=training_args.disable_tqdm, **call_kwargs)
    id_column = data_args.id_column_name or ("id" if "id" in test.column_names else None)
    predictions = folder / "predictions.csv"
    rows = write_predictions(outputs, predictions, final.config.expert_names,
                             ids=test[id_column] if id_column else None, id_column=id_column or "row",
                             columns={name: test[name] for name in data_args.copied_columns},
                             route_only=is_route_only(final))
    return predictions, rows


def _report(output: OutputFolder, folder: Path, final: Any, predictions: Path | None, rows: int,
            data_args: DataTrainingArguments, results: dict[str, float]) -> None:
    """Writes `hf_defer_run.json` (completed) and prints the metrics table and the summary, each number once."""
    summary = {"status": "completed", "model": str(folder),
               "predictions": str(predictions) if predictions else None,
               "predicted_rows": rows, "defer_threshold": float(final.config.defer_threshold),
               "max_deferral_rate": data_args.max_deferral_rate,
               "metrics": {stage: stage_metrics(results, stage) for stage in STAGES
                           if stage_metrics(results, stage)},
               "summary_file": str(folder / RUN_SUMMARY)}
    output.write_summary(summary)
    table = format_metrics_table(summary["metrics"])
    print((table + "\n" if table else "") + format_summary({**summary, "metrics": {}}))  # each number once


def _push_folder(final: Any, repo_id: str, processor: Any, card: Any, training_args: TrainingArguments,
                 folder: Path) -> None:
    """`--push_to_hub`: uploads the model; a failure names the saved folder and how to upload it later."""
    try:
        push_to_hub(final, repo_id, processing_class=processor, card_data=card,
                    token=training_args.hub_token, private=training_args.hub_private_repo)
    except Exception as error:  # no network, no token, no write access: the model stays here
        raise ConnectionError(
            f"--push_to_hub: the model is saved in {folder}, but uploading it to the Hub repository "
            f"{repo_id!r} failed ({first_line(error)}); upload it later with `hf upload {repo_id} {folder}` "
            "(after `hf auth login`).") from error


def _run_deferral(model_args: ModelArguments, data_args: DataTrainingArguments, training_args: TrainingArguments,
                  output: OutputFolder) -> dict[str, float]:
    """[`run_deferral`] once `--output_dir`, the stages and the model's source are checked."""
    set_seed(training_args.seed)
    hub = _hub_kwargs(model_args)
    with training_args.main_process_first(desc="loading and preparing the data"):
        data = _load_and_prepare(model_args, data_args, training_args, hub)
    if training_args.process_index == 0:  # the data is fine: the folder becomes this run's (before any checkpoint)
        output.start()
    _log_training_samples(data.splits, training_args)
    if data.image_column:
        training_args.remove_unused_columns = False  # pixel_values are made from the images when rows are read
    max_length = data_args.max_seq_length
    if data.frozen_text:
        model, data.splits, max_length = _head_on_embeddings(model_args, training_args, data, max_length)
    else:
        model = _encoder_model(model_args, data, hub)
    if model_args.use_lora:
        model = with_lora(model, model_args)
    repo_id = training_args.hub_model_id or os.path.basename(os.path.normpath(training_args.output_dir))
    push = training_args.push_to_hub
    _check_hub_repository(repo_id, training_args)
    trainer = _make_trainer(model, training_args, data)
    results: dict[str, float] = {}
    flat = _train_and_evaluate(trainer, training_args, data.splits, results)  # a warning at the end: a flat loss

    final = _final_model(model, model_args, trainer, data)
    processor = data.processor
    if hasattr(processor, "model_max_length"):  # pipelines called with truncation=True cut where training did
        processor.model_max_length = min(processor.model_max_length, max_length)
    call_kwargs = {"truncation": True} if not data.image_column else {}
    columns = (data.text_column, data_args.text_pair_column_name, data.image_column, data_args.side_features)
    if any(promise is not None for promise in (data_args.max_deferral_rate, data_args.max_error,
                                               data_args.max_mean_cost)):
        threshold = _calibrate_threshold(final, data, data_args, training_args, columns, call_kwargs)
        model.config.defer_threshold = threshold
        model.config.deferral_guarantee = final.config.deferral_guarantee
        model.config.calibrated_expert_costs = final.config.calibrated_expert_costs
        results["defer_threshold"] = threshold
        logger.info(f"deferral threshold {threshold:.4f}; guarantee: {final.config.deferral_guarantee}")
        if training_args.do_eval:
            _record(trainer, "calibrated_eval", trainer.evaluate(metric_key_prefix="calibrated_eval"), results)
    if training_args.do_predict and "test" in data.splits:  # the saved model's numbers: after calibrating
        tested = trainer.evaluate(data.splits["test"], metric_key_prefix="test")
        _record(trainer, "test", {**tested, "test_samples": len(data.splits["test"])}, results)

    card = _card_data(trainer, model_args, data_args, final, repo_id, data.image_column, results)
    if trainer.is_world_process_zero():
        folder = Path(training_args.output_dir).resolve()
        save_for_hub(final, folder, processing_class=processor, card_data=card, overwrite=True)  # folder checked above
        predictions, rows = None, 0
        if training_args.do_predict and "test" in data.raw:
            predictions, rows = _write_test_predictions(final, data, data_args, training_args, folder, columns,
                                                        call_kwargs)
        _report(output, folder, final, predictions, rows, data_args, results)
        if flat:
            logger.warning(flat)
        if push:
            _push_folder(final, repo_id, processor, card, training_args, folder)
    return results
