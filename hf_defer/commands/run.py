"""Train, evaluate, calibrate, save and predict from a user's data: what `scripts/run_deferral.py` and
`hf-defer train` run.

[`run_deferral`] follows transformers' `run_classification.py`: load the data (Hub dataset or files), prepare it
([`prepare_deferral_dataset`]), build the model around the encoder, train and evaluate with [`DeferralTrainer`],
calibrate a deferral budget, save a Hub-ready folder, write `predictions.csv`, push to the Hub. All data checks run
before the model is loaded. It runs unchanged under `accelerate launch` and `torchrun`.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets
from transformers import AutoImageProcessor, AutoTokenizer, TrainingArguments, set_seed

from .arguments import DataTrainingArguments, ModelArguments
from ..evaluation.calibration import calibrate_deferral
from ..modeling.configuration_deferral import DeferralConfig
from ..experts.simulated import annotator_expert, class_subset_expert
from ..hub.sharing import push_to_hub, save_for_hub
from ..modeling.modeling_deferral import EncoderForDeferral
from ..data.preparation import prepare_deferral_dataset
from ..training.trainer import DeferralTrainer

__all__ = ["load_raw_datasets", "pipeline_inputs", "run_deferral", "sentence_encoder_pooling", "write_predictions"]

logger = logging.getLogger(__name__)


def load_raw_datasets(data_args: DataTrainingArguments, seed: int = 0) -> datasets.DatasetDict:
    """The `train` / `validation` / `test` splits named by `--dataset_name` or the data files. Without a validation
    split, `--validation_split_percentage` of train is held out (seeded). `--max_*_samples` keep the first rows."""
    if data_args.dataset_name is not None:
        raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name)
    else:
        files = {split: path for split, path in (("train", data_args.train_file),
                                                   ("validation", data_args.validation_file),
                                                   ("test", data_args.test_file)) if path is not None}
        extensions = {path.rsplit(".", 1)[-1].lower().replace("jsonl", "json") for path in files.values()}
        if len(extensions) > 1:
            raise ValueError(f"the data files must share one format, got {sorted(files.values())}.")
        builder = extensions.pop()  # one file at a time: a test file may lack the label and expert columns
        raw = datasets.DatasetDict({split: datasets.load_dataset(builder, data_files={split: path}, split=split)
                                    for split, path in files.items()})
    if not isinstance(raw, datasets.DatasetDict):
        raw = datasets.DatasetDict({"train": raw})
    if "validation" not in raw and "train" in raw:
        held = raw["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, seed=seed)
        raw["train"], raw["validation"] = held["train"], held["test"]
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples),
                         ("test", data_args.max_predict_samples)):
        if limit is not None and split in raw:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return raw


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


def _input_columns(raw: datasets.DatasetDict, data_args: DataTrainingArguments) -> tuple[str | None, str | None]:
    """The text and image columns: as given, else the first column of images, else `text`."""
    if data_args.text_column_name or data_args.image_column_name:
        return data_args.text_column_name, data_args.image_column_name
    features = next(iter(raw.values())).features
    images = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    if images:
        return None, images[0]
    if "text" in features:
        return "text", None
    raise ValueError(f"give --text_column_name or --image_column_name; the data's columns are {list(features)}.")


def sentence_encoder_pooling(path: str) -> tuple[str, bool]:
    """How `sentence-transformers` pools the encoder at `path`: `(pooling, normalize)`. A plain transformers folder
    gets mean pooling without normalization, as `SentenceTransformer(path)` builds it."""
    modules_file = Path(path) / "modules.json"
    if not modules_file.is_file():
        return "mean", False
    modules = json.loads(modules_file.read_text())
    pooling, normalize = "mean", any(m["type"].endswith("Normalize") for m in modules)
    for module in modules:
        if module["type"].endswith("Pooling"):
            config = json.loads((Path(path) / module["path"] / "config.json").read_text())
            modes = [mode for mode in ("cls", "mean", "max") if config.get(f"pooling_mode_{mode}_token"
                                                                           f"{'' if mode == 'cls' else 's'}")]
            if len(modes) != 1:
                raise ValueError(f"{path}: sentence-transformers pooling {config} has no one cls/mean/max mode.")
            pooling = modes[0]
    return pooling, normalize


def pipeline_inputs(dataset: datasets.Dataset, text_column: str | None = None, text_pair_column: str | None = None,
                    image_column: str | None = None) -> list[Any]:
    """The raw inputs of a split, as the deferral pipeline takes them: texts, text pairs or images."""
    dataset = dataset.with_format(None)
    if image_column is not None:
        return list(dataset[image_column])
    if text_pair_column is not None:
        return [{"text": t, "text_pair": p} for t, p in zip(dataset[text_column], dataset[text_pair_column])]
    return list(dataset[text_column])


_HEAD_FIELDS = ("surrogate", "id2label", "num_experts", "expert_names", "expert_costs", "expert_kinds",
                "defer_threshold", "head_hidden_sizes", "head_dropout")


def head_on_sentence_encoder(head_model: EncoderForDeferral, encoder_path: str) -> EncoderForDeferral:
    """The head of a head-only model trained on the sentence embeddings of `encoder_path`, put on that encoder with
    its own pooling (and normalization), so that the text model computes what the head was trained on. The encoder
    is frozen; the config (surrogate, classes, experts, costs, threshold) is the head-only model's."""
    pooling, normalize = sentence_encoder_pooling(encoder_path)
    fields = {key: getattr(head_model.config, key) for key in _HEAD_FIELDS}
    text_model = EncoderForDeferral.from_encoder_pretrained(encoder_path, pooling=pooling, normalize_pooled=normalize,
                                                            freeze_encoder=True, **fields)
    text_model.head.load_state_dict(head_model.head.state_dict())
    return text_model


def write_predictions(outputs: Iterable[dict[str, Any]], path: str | os.PathLike, expert_names: list[str]) -> int:
    """Writes deferral-pipeline outputs as CSV: `id` (the row number), `label, defer, expert, class_label,
    class_score` and one `expert_accuracy_<name>` column per expert. Returns the number of rows."""
    header = ["id", "label", "defer", "expert", "class_label", "class_score"]
    header += [f"expert_accuracy_{name}" for name in expert_names]
    count = 0
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for count, out in enumerate(outputs, start=1):
            writer.writerow([count - 1, out["label"], out["defer"], out["expert"] or "", out["class_label"],
                             repr(out["class_score"]), *map(repr, out["expert_accuracy"])])
    return count


def with_lora(model: EncoderForDeferral, model_args: ModelArguments) -> Any:
    """``model`` with LoRA adapters on its encoder (`peft.get_peft_model`) and its deferral head trained in full."""
    if model.encoder is None:
        raise ValueError("--use_lora needs an encoder to adapt; with --freeze_encoder on text only a head is trained.")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ImportError("--use_lora needs peft: pip install 'hf-defer[peft]'.") from None
    config = LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout,
                        target_modules=model_args.lora_targets, modules_to_save=["head"])
    return get_peft_model(model, config)


def run_deferral(model_args: ModelArguments, data_args: DataTrainingArguments,
                 training_args: TrainingArguments) -> dict[str, float]:
    """Runs what the flags ask and saves a Hub-ready folder to `--output_dir`.

    In order: load the splits ([`load_raw_datasets`]); add a simulated expert if asked; check and prepare every split
    with [`prepare_deferral_dataset`] (all data errors come here, before any model is loaded); build the model (with
    `--freeze_encoder` on text: a head on cached sentence embeddings, later put on the encoder with the same pooling);
    `--do_train`, `--do_eval` (validation, before calibration); `--max_deferral_rate`: calibrate the pipeline's
    threshold on the validation inputs with the pipeline's own tokenizer settings; `--do_predict` (test metrics when
    the test split is labelled, with the calibrated threshold: those of the saved model); save model, processor (truncating at `--max_seq_length`), code, card and `all_results.json`;
    write `predictions.csv` for every test row; `--push_to_hub`: upload the folder.

    Args:
        model_args ([`ModelArguments`]), data_args ([`DataTrainingArguments`]), training_args
            (`transformers.TrainingArguments`): see [`parse_run_arguments`].

    Returns:
        `dict[str, float]`: the train / eval / test metrics and, when calibrated, `defer_threshold`.

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
    set_seed(training_args.seed)
    with training_args.main_process_first(desc="loading and preparing the data"):
        raw = load_raw_datasets(data_args, training_args.seed)
        expert_columns = data_args.expert_columns
        if data_args.simulated_expert:
            raw, expert_columns = _simulate_expert(raw, data_args), [data_args.simulated_expert]
        text_column, image_column = _input_columns(raw, data_args)
        frozen_text = model_args.freeze_encoder and image_column is None
        processor_path = model_args.model_name_or_path
        if frozen_text:
            from ..experts.embeddings import resolve_sentence_encoder

            processor_path = resolve_sentence_encoder(model_args.model_name_or_path)
        processor = (AutoImageProcessor if image_column else AutoTokenizer).from_pretrained(processor_path)
        # Checks every column before any model is loaded.
        needed = [data_args.label_column_name, *expert_columns]
        labelled = datasets.DatasetDict({split: part for split, part in raw.items()  # a test file may be unlabelled
                                         if split != "test" or all(c in part.column_names for c in needed)})
        prepared = prepare_deferral_dataset(
            labelled, data_args.label_column_name, expert_columns, text_column=text_column,
            text_pair_column=data_args.text_pair_column_name, image_column=image_column,
            processor=None if frozen_text else processor, max_length=data_args.max_seq_length,
            label_names=data_args.classes, missing_expert=data_args.missing_expert)
    splits, names = prepared.dataset, prepared.model_kwargs()
    if image_column:
        training_args.remove_unused_columns = False  # pixel_values are made from the images when rows are read
    pooling = model_args.pooling
    if frozen_text:
        pooling, normalize = sentence_encoder_pooling(processor_path)
        if model_args.pooling not in (None, pooling) or (model_args.normalize_pooled and not normalize):
            raise ValueError(f"--freeze_encoder trains on {processor_path}'s sentence embeddings ({pooling} pooling"
                             f"{', normalized' if normalize else ''}); drop --pooling / --normalize_pooled.")
        from ..experts.embeddings import add_embeddings

        with training_args.main_process_first(desc="sentence embeddings"):
            splits = add_embeddings(splits, processor_path, cache_dir=model_args.embedding_cache_dir,
                                    show_progress_bar=False)
        width = len(splits["train" if "train" in splits else "validation"][0]["features"])
        model = EncoderForDeferral(DeferralConfig(feature_size=width, surrogate=model_args.surrogate, **names))
    else:
        model = EncoderForDeferral.from_encoder_pretrained(
            model_args.model_name_or_path, surrogate=model_args.surrogate, pooling=pooling,
            normalize_pooled=model_args.normalize_pooled, freeze_encoder=model_args.freeze_encoder, **names)
    if model_args.use_lora:
        model = with_lora(model, model_args)
    trainer = DeferralTrainer(
        model=model, args=training_args, processing_class=None if frozen_text else processor,
        train_dataset=splits.get("train") if training_args.do_train else None,
        eval_dataset=splits.get("validation") if training_args.do_eval else None)
    metrics: dict[str, float] = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics.update(result.metrics, train_steps=result.global_step)
        trainer.log_metrics("train", result.metrics)
    if training_args.do_eval:
        evaluated = trainer.evaluate()
        metrics.update(evaluated)
        trainer.log_metrics("eval", evaluated)

    final = model
    if model_args.use_lora:  # adapters merged into the encoder: a plain deferral model that saves and loads as any
        final = model.merge_and_unload()
        trainer.model = trainer.model_wrapped = final
    if frozen_text:  # the head goes on the encoder: mean/cls pooling (+ normalization) reproduces the embeddings
        final = head_on_sentence_encoder(model, processor_path)
    final.eval()
    if hasattr(processor, "model_max_length"):  # pipelines called with truncation=True cut where training did
        processor.model_max_length = min(processor.model_max_length, data_args.max_seq_length)
    call_kwargs = {"truncation": True} if not image_column else {}
    columns = (text_column, data_args.text_pair_column_name, image_column)
    if data_args.max_deferral_rate is not None:
        threshold = calibrate_deferral(final, pipeline_inputs(raw["validation"], *columns), data_args.max_deferral_rate,
                                       batch_size=training_args.per_device_eval_batch_size,
                                       tokenizer=None if image_column else processor,
                                       image_processor=processor if image_column else None, **call_kwargs)
        model.config.defer_threshold = threshold
        metrics["defer_threshold"] = threshold
        logger.info(f"deferral threshold {threshold:.4f} defers at most {data_args.max_deferral_rate:.0%} of inputs")
    if training_args.do_predict and "test" in splits:  # the saved model's numbers: after calibrating its threshold
        tested = trainer.evaluate(splits["test"], metric_key_prefix="test")
        metrics.update(tested)
        trainer.log_metrics("test", tested)

    repo_id = training_args.hub_model_id or os.path.basename(os.path.normpath(training_args.output_dir))
    card = trainer.model_card_data(base_model=model_args.model_name_or_path, model_name=repo_id.split("/")[-1],
                                   input_kind="image" if image_column else "text",
                                   defer_threshold=float(final.config.defer_threshold),
                                   dataset_id=data_args.dataset_name)
    if trainer.is_world_process_zero():
        save_for_hub(final, training_args.output_dir, processing_class=processor, card_data=card, overwrite=True)
        with open(os.path.join(training_args.output_dir, "all_results.json"), "w") as handle:
            json.dump(metrics, handle, indent=2)
        if training_args.do_predict and "test" in raw:
            from transformers import pipeline

            pipe = pipeline("deferral", model=final, tokenizer=None if image_column else processor,
                            image_processor=processor if image_column else None, device=final.device)
            inputs = pipeline_inputs(raw["test"], *columns)  # every row, also those without an annotation
            outputs = pipe(inputs, batch_size=training_args.per_device_eval_batch_size, **call_kwargs)
            write_predictions(outputs, os.path.join(training_args.output_dir, "predictions.csv"),
                              final.config.expert_names)
        if training_args.push_to_hub:
            push_to_hub(final, repo_id, processing_class=processor, card_data=card,
                        token=training_args.hub_token, private=training_args.hub_private_repo)
    return metrics
