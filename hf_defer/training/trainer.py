"""DeferralTrainer: `transformers.Trainer` for deferral models."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from typing import Any

import accelerate.optimizer
import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, Trainer
from transformers.utils import logging
from transformers.trainer_utils import EvalLoopOutput, IntervalStrategy

from .adapters import load_adapter_checkpoint
from ..inspection.adapters import check_adapter_loadable, check_head_trainable, has_adapters, is_peft_model
from ..inspection.model_checks import check_deferral_model, last_complete_checkpoint
from ..data.checks import check_deferral_dataset
from ..data.collator import DataCollatorForDeferral
from ..data.labels import check_label_names
from ..modeling.surrogate_base import IGNORE_INDEX
from ..modeling.surrogate_routing import is_route_only
from ..evaluation.metrics import DeferralMetrics, deferral_metrics, expert_targets as _expert_targets
from ..hub.model_card import DeferralModelCardData, render_model_card
from .tokenization import align_special_tokens_quietly, ensure_pad_token

logger = logging.get_logger(__name__)

_ESTIMATES = {"class_probs", "expert_accuracy", "defer"}
"""The outputs of `EncoderForDeferral.forward` besides the logits that evaluation would compute and drop."""


HEAD_ONLY_SLOW_RATE = 1e-4
"""At or below this learning rate (transformers' default is 5e-5), [`DeferralTrainer`] warns that a head trained alone
barely moves."""


class DeferralTrainer(Trainer):
    """A [`~transformers.Trainer`] for [`EncoderForDeferral`] models.

    What it adds to the plain Trainer:

    * the loss comes from the model (the configured surrogate), a mean over the rows of a batch; with gradient
      accumulation each batch's mean is weighted by its share of the rows of the whole optimizer step
      (``num_items_in_batch``, counted over all processes), so the batches of a step, a short last one included, give
      exactly the gradient of one batch holding all their rows (and the logged loss is that batch's mean loss);
    * ``compute_metrics`` defaults to [`DeferralMetrics`], so ``evaluate()`` reports ``eval_system_error``,
      ``eval_coverage``, ``eval_classifier_error`` (beside ``eval_majority_class_error``, the baseline),
      ``eval_expert_ece`` and the budgeted errors, all of the saved model's pipeline (the decision with the config's
      ``expert_costs`` and ``defer_threshold``, made without knowing who answered: deferrals to an expert with no
      recorded answer are ``eval_unscored_deferrals``; budgets ranked by margin, as [`calibrate_deferral`] meets them:
      ``deferral_metrics(..., budget_ranking="margin")``); a model whose head trains alone at a fine-tuning learning
      rate (at most 1e-4) gets a warning;
    * ``eval_loss`` is recomputed from the gathered logits of the whole evaluation set, so it is the mean
      surrogate loss over every example exactly once, however many processes evaluated it;
    * ``train_dataset`` and ``eval_dataset`` (and a dataset given to ``evaluate``) are checked before anything runs
      ([`check_deferral_dataset`]): missing or malformed label columns, labels outside ``num_labels`` or all -100, an
      untokenized text dataset, features of the wrong width or with NaN, texts longer than the encoder's positions,
      a ``ClassLabel`` label column whose names are not the model's ``id2label`` ([`check_label_names`])
      raise a ``ValueError`` at construction, not in the middle of an epoch (a streamed dataset: on its first
      examples);
    * ``train(resume_from_checkpoint=True)`` resumes from the newest *complete* checkpoint, skipping (with a warning)
      one left half-written by a run killed while saving;
    * the default collator is [`DataCollatorForDeferral`] (pads text with ``processing_class``, stacks
      ``features`` for head-only models, keeps ``expert_labels``);
    * a head-only model trained on a `datasets.Dataset` with ``features`` (and the default collator) takes a fast
      path: the three columns are held as tensors (up to ``head_only_max_bytes``) and every batch is one indexing of
      them, with the same sampler, so the same seed gives the same weights bit for bit; and since the dataset was
      checked once, the loss skips its per-batch checks of the values during training.

    Everything else (``TrainingArguments``, callbacks, checkpoints, ``accelerate launch``/``torchrun``) is the
    Trainer's own.

    Example:

    ```python
    >>> import numpy as np
    >>> from datasets import Dataset
    >>> from transformers import TrainingArguments
    >>> from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral
    >>> rng = np.random.default_rng(0)
    >>> data = Dataset.from_dict({"features": rng.normal(size=(64, 8)).astype("float32"),
    ...                           "labels": rng.integers(0, 3, 64), "expert_labels": rng.integers(0, 3, 64)})
    >>> model = EncoderForDeferral(DeferralConfig(feature_size=8, num_labels=3, num_experts=1))
    >>> args = TrainingArguments("out", num_train_epochs=1, report_to=[], use_cpu=True)
    >>> trainer = DeferralTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    >>> _ = trainer.train()  # the Trainer prints its final log  # doctest: +ELLIPSIS
    {'train_runtime': ...}
    >>> sorted(k for k in trainer.evaluate() if k.startswith("eval_") and "error" in k)[:2]
    ['eval_budgeted_error_10', 'eval_budgeted_error_20']
    ```
    """

    # Decided per step by `compute_loss`: the model's mean loss is rescaled by `num_items_in_batch` whenever the Trainer
    # counts it (see there); only when it does not (DataParallel, no labels) does the Trainer divide by the steps.
    loss_is_scaled_for_ga = False

    head_only_max_bytes: int = 2**30
    """Largest head-only training set (its features, labels and expert labels) held in memory for the fast path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Bind like Trainer.__init__ so that positional and keyword arguments are checked alike.
        bound = inspect.signature(Trainer.__init__).bind(None, *args, **kwargs)
        arguments = {**bound.arguments}
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))
        model = arguments.get("model")
        check_deferral_model(model)
        config = model.config
        check_head_trainable(model)
        try:
            check_adapter_loadable(model)
        except ValueError as error:  # training and evaluating work; saving the adapter would write a dead folder
            if getattr(arguments.get("args"), "push_to_hub", False):
                raise
            logger.warning(f"{error} DeferralTrainer will train it, but refuse save_model() and push_to_hub().")
        processing_class = arguments.get("processing_class")
        tokenizer = processing_class if isinstance(processing_class, PreTrainedTokenizerBase) else None
        if tokenizer is not None:
            ensure_pad_token(tokenizer, model)
            align_special_tokens_quietly(model, tokenizer)
        self._default_collator = arguments.get("data_collator") is None
        train_dataset = arguments.get("train_dataset")
        # check_deferral_dataset reads every value of a datasets.Dataset (a streamed one only on its first rows): the
        # loss need not check those again
        self._checked_train_dataset = train_dataset if isinstance(train_dataset, datasets.Dataset) else None
        self._head_only_rows_of: tuple[Any, _HeadOnlyRows | None] | None = None
        if arguments.get("data_collator") is None:
            arguments["data_collator"] = DataCollatorForDeferral(tokenizer=tokenizer)
        if arguments.get("compute_metrics") is None:
            # The numbers of the saved model's pipeline: its costs and threshold decide, budgets as calibration's.
            arguments["compute_metrics"] = DeferralMetrics(config, budget_ranking="margin")
        for name in ("train_dataset", "eval_dataset"):
            dataset = arguments.get(name)
            if isinstance(dataset, dict):
                for split, part in dataset.items():
                    check_deferral_dataset(part, model, f"{name}[{split!r}]", require_answers=name == "train_dataset")
                    check_label_names(part, config, f"{name}[{split!r}]")
            elif dataset is not None:  # an expert who answered no training row would learn nothing: refused
                check_deferral_dataset(dataset, model, name, require_answers=name == "train_dataset")
                check_label_names(dataset, config, name)  # class ids that mean the model's classes, not others
        super().__init__(**arguments)
        half = [name for name, parameter in model.named_parameters()
                if parameter.requires_grad and parameter.dtype == torch.float16]
        if half:  # transformers 5 loads a float16 checkpoint as float16 (dtype="auto"); AdamW on it goes NaN
            logger.warning(
                f"DeferralTrainer: {len(half)} trainable parameters are float16 (e.g. {half[0]!r}); optimizer updates in "
                "float16 overflow to inf/NaN, and the logged loss leaves non-finite steps out (logging_nan_inf_filter). "
                "Load the encoder in float32 (from_encoder_pretrained(..., dtype=torch.float32)) and train with "
                "bf16=True or fp16=True, which compute in half precision over float32 weights.")
        head_only = getattr(model, "encoder", None) is None or not any(
            parameter.requires_grad for parameter in model.encoder.parameters())
        if head_only and self.args.learning_rate <= HEAD_ONLY_SLOW_RATE:
            logger.warning(
                f"DeferralTrainer: only the head trains (no encoder, or a frozen one), at learning_rate "
                f"{self.args.learning_rate:g}: a head barely moves at fine-tuning rates in a few hundred steps and "
                "ends up answering the majority class. Use a larger rate (hf-defer train --freeze_encoder trains at "
                "1e-2 for 10 epochs), and compare eval_classifier_error with eval_majority_class_error.")
        if self.args.dataloader_pin_memory and self.args.device.type == "cpu":  # torch warns: nothing to pin on CPU
            self.args.dataloader_pin_memory = False
        # The model's forward takes no `num_items_in_batch` (it returns the mean loss of its batch); this tells the
        # Trainer to count the rows of each optimizer step and pass the count to `compute_loss`, which rescales.
        self.model_accepts_loss_kwargs = True

    # ------------------------------------------------------------------ data loading and training steps
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """[`Trainer.train`]; with ``resume_from_checkpoint=True`` from the newest checkpoint of ``args.output_dir``
        that was completely written ([`last_complete_checkpoint`]), not merely the newest folder."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir) or True
        with _lomo_probe_once():
            return super().train(resume_from_checkpoint, *args, **kwargs)

    def evaluate(self, eval_dataset: Any = None, *args: Any, **kwargs: Any) -> dict[str, float]:
        """[`Trainer.evaluate`]; a dataset given here is checked first, as those given to the constructor are."""
        if eval_dataset is not None and not isinstance(eval_dataset, (str, dict)):  # a dict comes back split by split
            model = self.accelerator.unwrap_model(self.model)
            check_deferral_dataset(eval_dataset, model, "eval_dataset")
            check_label_names(eval_dataset, model.config, "eval_dataset")
        return super().evaluate(eval_dataset, *args, **kwargs)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """The model's loss, the mean over the counted rows (label != -100) of this batch; in training, with
        ``num_items_in_batch`` (the counted rows of all batches of the optimizer step, on all processes), it becomes
        ``sum over this batch's rows / num_items_in_batch``, so that the step's batches add up to the mean over all
        its rows: 4 + 4 + 2 rows accumulated give the gradient of one batch of 10, not a mean of three means."""
        if model.training and self.train_dataset is not None and self.train_dataset is self._checked_train_dataset:
            inputs = {**inputs, "check_inputs": False}  # checked once at construction: no pass, no sync per step
        if self.compute_loss_func is not None:  # the user's loss function takes the count itself
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        rescale = (model.training and num_items_in_batch is not None and self.args.n_gpu <= 1
                   and isinstance(inputs.get("labels"), torch.Tensor))
        self.loss_is_scaled_for_ga = rescale  # read by `training_step` right after this call
        loss, outputs = super().compute_loss(model, inputs, True, None)  # None: the model's forward takes no count
        if rescale:
            counted = (inputs["labels"] != IGNORE_INDEX).sum()
            loss = loss * counted / torch.as_tensor(num_items_in_batch, device=loss.device).clamp(min=1)
            if self.args.average_tokens_across_devices:  # the count is of all processes, and DDP averages gradients
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> Any:
        ignored = ignore_keys if ignore_keys is not None else getattr(model.config, "keys_to_ignore_at_inference", [])
        if _ESTIMATES <= set(ignored):  # the step keeps the logits only: the estimates would be computed and dropped
            inputs = {**inputs, "output_estimates": False}
        if "expert_correct" in inputs and "expert_labels" not in inputs and self.args.label_names is None:
            names = self.label_names  # gather the scores as targets (a route-only model has them alone)
            self.label_names = ["labels", "expert_correct"] if "labels" in inputs else ["expert_correct"]
            try:
                return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            finally:
                self.label_names = names
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        # transformers.Trainer._get_grad_norm computes the norm of all gradients at every step, only to log it, also
        # when max_grad_norm=0 asks for no clipping; with nothing logged there is no reader for it.
        if grad_norm is None and self.args.logging_strategy == IntervalStrategy.NO:
            return None
        return super()._get_grad_norm(model, grad_norm)

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """The Trainer's training loader; on the head-only fast path its dataset is [`_HeadOnlyRows`] and its collate
        function passes the batch through (same sampler, same batch size, same `accelerate` preparation)."""
        rows = self._head_only_rows()
        if rows is None:
            return super().get_train_dataloader()
        collator, self.data_collator = self.data_collator, _batch_as_is
        try:
            return self._get_dataloader(dataset=rows, description="Training", batch_size=self._train_batch_size,
                                        sampler_fn=self._get_train_sampler, is_training=True)
        finally:
            self.data_collator = collator

    def _get_collator_with_removed_columns(self, data_collator: Any, description: str | None = None) -> Any:
        # transformers.Trainer wraps the collator of every dataset that is not a datasets.Dataset in a
        # RemoveColumnsCollator, which rebuilds each row as a dict; _HeadOnlyRows holds the model's inputs only.
        if data_collator is _batch_as_is:
            return data_collator
        return super()._get_collator_with_removed_columns(data_collator, description)

    def _head_only_rows(self) -> _HeadOnlyRows | None:
        """The training set as tensors when the fast path applies (else None), built once per training set."""
        dataset, model = self.train_dataset, self.accelerator.unwrap_model(self.model)
        if self._head_only_rows_of is not None and self._head_only_rows_of[0] is dataset:
            return self._head_only_rows_of[1]
        rows = None
        if (
            self._default_collator
            and getattr(model.config, "encoder", True) is None
            and isinstance(dataset, datasets.Dataset)
            and {"features", "labels"} <= set(dataset.column_names)
            and not {"side_categorical", "side_numeric"} & set(dataset.column_names)  # the fast path holds 3 columns
            and ("expert_labels" in dataset.column_names) != ("expert_correct" in dataset.column_names)
            and self.args.train_sampling_strategy in ("random", "sequential")
        ):
            targets = "expert_correct" if "expert_correct" in dataset.column_names else "expert_labels"
            columns = dataset.select_columns(["features", "labels", targets])
            if columns.data.nbytes <= self.head_only_max_bytes:
                try:
                    rows = _HeadOnlyRows.from_dataset(columns)
                except (TypeError, ValueError):  # ragged or non-numeric rows: the collator path says which row
                    rows = None
        self._head_only_rows_of = (dataset, rows)
        return rows

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        logits, label_ids = output.predictions, output.label_ids
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        if logits is not None and isinstance(label_ids, (tuple, list)) and len(label_ids) == 2:
            surrogate = self.accelerator.unwrap_model(self.model).surrogate
            loss = surrogate(torch.as_tensor(np.asarray(logits)), torch.as_tensor(np.asarray(label_ids[0])),
                             **_expert_targets(label_ids[1]))
            output.metrics[f"{metric_key_prefix}_loss"] = float(loss)
            # Kept for the model card (metrics with reliability-diagram data): see `model_card_data`.
            self._last_deferral_eval = (metric_key_prefix, logits, label_ids[0], label_ids[1])
        elif logits is not None and label_ids is not None and is_route_only(self.model):
            targets = np.asarray(label_ids)  # a route-only model's only targets: expert_correct
            loss = self.accelerator.unwrap_model(self.model).surrogate(torch.as_tensor(np.asarray(logits)),
                                                                       expert_correct=torch.as_tensor(targets))
            output.metrics[f"{metric_key_prefix}_loss"] = float(loss)
            self._last_deferral_eval = (metric_key_prefix, logits, None, targets)
        return output

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Resumes like the Trainer, plus the adapters that `add_adapter` gave the model (the Trainer resumes the
        adapters of a `PeftModel` only)."""
        unwrapped = self.accelerator.unwrap_model(model if model is not None else self.model)
        if has_adapters(unwrapped) and not is_peft_model(unwrapped):
            return load_adapter_checkpoint(unwrapped, resume_from_checkpoint)
        return super()._load_from_checkpoint(resume_from_checkpoint, model)

    # ------------------------------------------------------------------ saving, Hub and model card
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Saves the model like the Trainer and, when called by the user, writes the deferral model card next to it;
        refuses an adapter whose folder could not be loaded again ([`check_adapter_loadable`]; checkpoints, which
        resume the model in memory, are still written)."""
        if not _internal_call:
            check_adapter_loadable(self.accelerator.unwrap_model(self.model))
        super().save_model(output_dir, _internal_call)
        if not _internal_call:
            self.create_model_card(save_directory=output_dir)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        """[`Trainer.push_to_hub`] with the deferral model card; refuses an adapter that could not be loaded from the
        repository ([`check_adapter_loadable`]) before anything is uploaded."""
        check_adapter_loadable(self.accelerator.unwrap_model(self.model))
        return super().push_to_hub(*args, **kwargs)

    def model_card_data(self, **fields: Any) -> DeferralModelCardData:
        """The [`DeferralModelCardData`] of the trained model: its configuration, the metrics (with the config's
        costs and threshold, budgets ranked by margin) and reliability data of the last evaluation, the training
        data size and the main hyperparameters; `fields` override them."""
        model = self.accelerator.unwrap_model(self.model)
        values: dict[str, Any] = {}
        last = getattr(self, "_last_deferral_eval", None)
        if last is not None:
            prefix, logits, labels, expert_labels = last
            # The same numbers as evaluate()'s (see __init__): those of the saved model's pipeline.
            metrics = deferral_metrics(logits, labels, surrogate=model.config, return_reliability=True,
                                       budget_ranking="margin", **_expert_targets(expert_labels))
            values["budget_ranking"] = "margin"
            values["reliability"] = metrics.pop("reliability")
            values["metrics"] = metrics
            values["num_eval_examples"] = len(expert_labels) if labels is None else int(np.sum(np.asarray(labels) != -100))
            values["dataset_split"] = "validation" if prefix == "eval" else prefix
            answers = np.asarray(expert_labels)[np.asarray(labels) != -100] if labels is not None else np.zeros(0)
            if labels is not None and any(model.config.expert_costs or []) and answers.dtype.kind in "iu" and not (answers == -100).any():
                values["error_cost_curve"] = _error_cost_front(model, logits, labels, expert_labels)
        else:
            logged = [entry for entry in self.state.log_history if any(k.endswith("_system_error") for k in entry)]
            if logged:
                values["metrics"] = {k: v for k, v in logged[-1].items() if isinstance(v, (int, float))}
                values["budget_ranking"] = getattr(self.compute_metrics, "budget_ranking", "expert_accuracy")
        train_dataset = self.train_dataset
        if train_dataset is not None and hasattr(train_dataset, "__len__"):
            values["num_train_examples"] = len(train_dataset)
        args = self.args
        values["hyperparameters"] = {
            "learning_rate": args.learning_rate,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "num_train_epochs": round(float(self.state.epoch or 0.0), 4),  # trained, not asked for (max_steps cuts)
            "optimizer": str(getattr(args.optim, "value", args.optim)),
            "lr_scheduler_type": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
            "seed": args.seed,
            "training_steps": self.state.global_step,
        }
        repo_id = self.hub_model_id or args.hub_model_id
        if repo_id:
            values["repo_id"] = repo_id
            values["model_name"] = repo_id.split("/")[-1]
        elif args.output_dir:  # the card is named after the model, not "deferral-model"
            values["model_name"] = os.path.basename(os.path.normpath(args.output_dir))
        values.update(fields)
        return DeferralModelCardData.from_model(model, **values)

    def create_model_card(
        self,
        language: str | None = None,
        license: str | None = None,
        tags: str | list[str] | None = None,
        model_name: str | None = None,
        finetuned_from: str | None = None,
        tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None,
        dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
        *,
        save_directory: str | None = None,
        overwrite_model_card: bool | None = None,
        **card_fields: Any,
    ) -> None:
        """Writes the deferral model card (`README.md` and `reliability_diagram.png`) instead of the generic Trainer
        card; [`Trainer.push_to_hub`] calls it, and passes its extra keyword arguments along.

        Args:
            language, license, tags, model_name, finetuned_from, dataset: card metadata, as for the Trainer
                (`finetuned_from` is the base encoder, `dataset` a Hub dataset id or a name). `tasks`,
                `dataset_tags` and `dataset_args` are accepted for compatibility and not used.
            save_directory (`str`, *optional*): where to write; defaults to `args.output_dir`.
            overwrite_model_card (`bool`, *optional*): replace a `README.md` that hf_defer did not write (otherwise
                it is kept, with a warning); defaults to `True` for a model with adapters, whose save writes peft's
                generic card, and `False` otherwise.
            card_fields: any [`DeferralModelCardData`] field, e.g. `expert_description="..."`.
        """
        if not self.is_world_process_zero():
            return
        fields: dict[str, Any] = {"language": language, "license": license, "model_name": model_name,
                                  "base_model": finetuned_from}
        if isinstance(tags, str):
            tags = [tags]
        fields["tags"] = list(tags) if tags else None
        if isinstance(dataset, (list, tuple)):
            dataset = dataset[0] if dataset else None
        if dataset is not None:
            fields["dataset_id"] = dataset
        fields = {key: value for key, value in fields.items() if value is not None}
        if overwrite_model_card is None:
            overwrite_model_card = has_adapters(self.accelerator.unwrap_model(self.model))
        data = self.model_card_data(**{**fields, **card_fields})
        try:
            render_model_card(data, save_directory or self.args.output_dir, overwrite=overwrite_model_card)
        except FileExistsError as error:
            logger.warning(f"{error} Kept it; pass overwrite_model_card=True to replace it with the deferral card.")


def _error_cost_front(model: Any, logits: Any, labels: Any, expert_labels: Any) -> dict[str, list[float]]:
    """The Pareto front of [`hf_defer.evaluation.costs.error_cost_curve`] on evaluation logits (rows labelled -100 dropped),
    sweeping the decision-time costs as multiples of the model's `expert_costs`, for the model card."""
    from ..evaluation.costs import error_cost_curve

    labels = np.asarray(labels)
    kept = labels != -100
    class_probs, expert_accuracy = model.surrogate.probabilities(torch.as_tensor(np.asarray(logits)[kept]).float())
    curve = error_cost_curve(class_probs.numpy(), expert_accuracy.numpy(), labels[kept],
                             np.asarray(expert_labels)[kept], model.config.expert_costs,
                             threshold=float(model.config.defer_threshold))
    cost, error = curve.front()
    return {"cost": cost.tolist(), "error": error.tolist()}


class _HeadOnlyRows(torch.utils.data.Dataset):
    """The columns of a head-only training set as whole tensors: `__getitems__` returns a batch (a dict of tensors,
    the values [`DataCollatorForDeferral`] makes of the same rows) with one indexing per column, no per-row dicts."""

    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        self.columns = columns  # features, labels and expert_labels (or expert_correct)

    @classmethod
    def from_dataset(cls, dataset: datasets.Dataset) -> _HeadOnlyRows:
        table = dataset.with_format("numpy")[:]

        def array(values: Any, dtype: Any) -> torch.Tensor:
            values = np.stack(values) if values.dtype == object else values
            return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))

        targets = "expert_correct" if "expert_correct" in table else "expert_labels"
        return cls({"features": array(table["features"], np.float32), "labels": array(table["labels"], np.int64),
                    targets: array(table[targets], np.float32 if targets == "expert_correct" else np.int64)})

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices)
        return {name: column[index] for name, column in self.columns.items()}


def _batch_as_is(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Collate function of [`_HeadOnlyRows`]: its `__getitems__` already returns the batch."""
    return batch


@contextlib.contextmanager
def _lomo_probe_once() -> Iterator[None]:
    """`accelerate.optimizer.AcceleratedOptimizer.step` calls `accelerate.utils.is_lomo_available()`, an importlib
    `find_spec`, twice per optimizer step; whether `lomo_optim` is installed does not change during a run, so the
    probe runs once and its answer serves the run (restored afterwards)."""
    probe = accelerate.optimizer.is_lomo_available
    available = probe()
    accelerate.optimizer.is_lomo_available = lambda: available
    try:
        yield
    finally:
        accelerate.optimizer.is_lomo_available = probe
