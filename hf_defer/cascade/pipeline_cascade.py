"""The ``"deferral-cascade"`` pipeline: a saved [`DeferralCascade`] loaded and run by transformers' `pipeline()`.

A cascade folder keeps stage 1 at its root (the `config.json` and weights that `pipeline()` loads as the pipeline's
model), stage 2 in `stage2/` and `cascade_config.json`; the pipeline reads the last two from the folder stage 1 was
loaded from (`model.name_or_path`). Importing this module registers the task (after `import hf_defer`, importing
`transformers.pipelines` imports it; library mode only: the code copied next to the weights knows only the
single-model ``"deferral"`` task, which refuses a cascade folder).

Imports `hf_defer.modeling` (the model class and the pipeline's option checks), `hf_defer.hub.auto` (the model class
of the task) and `.modeling_cascade`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Pipeline

from ..modeling.cascade_folder import CASCADE_CONFIG_NAME
from ..modeling.device import check_device
from ..modeling.modeling_deferral import EncoderForDeferral
from ..modeling.surrogate_base import check_defer_threshold, check_expert_costs
from .modeling_cascade import (DeferralCascade, cascade_options, cascade_stage_folders, check_min_confidence,
                               read_cascade_config)

__all__ = ["CASCADE_TASK", "DeferralCascadePipeline"]

CASCADE_TASK = "deferral-cascade"
"""The task name this module registers for [`DeferralCascadePipeline`]."""
_NOT_OPTIONS = ("batch_size", "num_workers")  # the whole batch goes through the cascade at once


class _CascadeBatch:
    """The call's feature vectors and what the experts read, passed through `Pipeline.__call__` as one input (the
    cascade calls each expert once on all the inputs routed to it, so the batch is never split)."""

    __slots__ = ("features", "items", "single")

    def __init__(self, features: Any, items: Any, single: bool = False) -> None:
        self.features, self.items, self.single = features, items, single


def _cascade_folder(model: Any) -> Path:
    """The cascade folder of the pipeline's model: the folder it was loaded from, or that folder's parent for a
    cascade of the old layout (``model=<cascade>/stage1``)."""
    name = getattr(model, "name_or_path", None) or ""
    folder = Path(name)
    if not name or not folder.is_dir():
        raise ValueError(
            f"the {CASCADE_TASK!r} pipeline reads stage 2 and {CASCADE_CONFIG_NAME} from the folder its model was "
            f"loaded from, but model.name_or_path is {name!r}, not a local folder: pass model=<cascade folder> (one "
            "that DeferralCascade.save_pretrained wrote; for a cascade on the Hub, download it first with "
            "huggingface_hub.snapshot_download)."
        )
    if (folder / CASCADE_CONFIG_NAME).is_file():
        return folder
    parent = folder.resolve().parent
    if (parent / CASCADE_CONFIG_NAME).is_file() and cascade_stage_folders(parent)[0].resolve() == folder.resolve():
        return parent
    raise ValueError(
        f"{name!r} is not a deferral cascade folder: it has no {CASCADE_CONFIG_NAME}. Save the cascade with "
        "DeferralCascade.save_pretrained(folder) and pass that folder, or run a single deferral model with "
        f"pipeline('deferral', model={name!r})."
    )


class DeferralCascadePipeline(Pipeline):
    r"""
    A learned two-stage cascade ([`DeferralCascade`]) as a transformers pipeline: stage 1 answers or defers to an
    expert; where it defers to the escalation expert, stage 2 reads that expert's class probabilities and accepts its
    answer or pays another expert. Each expert is called once per call, on the inputs routed to it.

    Build it from a cascade folder (written by [`DeferralCascade.save_pretrained`]; one of the old layout, stage 1 in
    `stage1/`, with `model="<folder>/stage1"`):
    `pipeline("deferral-cascade", model=folder, experts={name: callable})`. Every expert of both stages needs a
    callable from a list of inputs to answers (class probabilities `[n, K]` for the escalation expert, class ids or
    names for the others), given when building the pipeline or at call time (call-time ones replace those of the same
    name).

    Inputs: feature vectors of the cascade's input width (`DeferralCascade.input_size`): a 2-D array (or tensor), a
    list of vectors, or one vector. A cascade whose stage 1 reads only a first expert's probabilities (input width 0)
    takes what the experts read instead: a list of inputs (texts, ...) or one input. Each input gives a `dict` (one
    `dict` for one input, a list for a batch), as [`DeferralCascade.__call__`]:

    - **label** (`str`) -- the answer: a classifier's class, or the answering expert's.
    - **answered_by** (`str`) -- `"model"` (a classifier of the cascade, stage 2's stacked answer included) or the
      answering expert's name.
    - **experts_called** (`list[str]`) -- the experts paid, in order.
    - **paid** (`float`) -- the price of `"model"` plus that of each expert called (`cascade_config.json`).

    Call parameters (all but `inputs` also accepted when building the pipeline):

    - **inputs** (*optional*) -- what the experts read (texts, images...): one per feature vector (for one vector,
      that input itself); the feature vectors by default.
    - **experts** (`Mapping[str, Callable]`, *optional*) -- experts for this call.
    - **stage1_costs**, **stage2_costs** (sequences of `float`, *optional*) -- each stage's decision cost per expert
      (the models' `expert_costs` when not given).
    - **stage1_threshold**, **stage2_threshold** (`float`, *optional*, default 0) -- each stage's margin to defer.
    - **stage2_min_confidence** (`float`, *optional*) -- stage 2 pays another expert exactly where the standing
      answer's max probability is below this (instead of the cost rule).

    `batch_size` and `num_workers` are refused: the whole call is one batch. `__call__` is overridden to take
    `inputs=` (the base class's first argument) and to pass the batch through `preprocess`, `_forward` (the cascade)
    and `postprocess` in one piece.

    Example:

    ```python
    >>> import tempfile, numpy as np, torch, hf_defer
    >>> from transformers import pipeline
    >>> stage1 = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(
    ...     feature_size=2, num_labels=2, num_experts=2, surrogate="aova", expert_names=["llm", "person"]))
    >>> stage2 = hf_defer.EncoderForRouting(hf_defer.DeferralConfig(
    ...     feature_size=2 + 2 + 3, route_only=True, num_experts=2, expert_names=["llm", "person"],
    ...     default_expert="llm"))
    >>> for model, bias in ((stage1, [0.0, 0.0, 2.0, 0.0]), (stage2, [0.0, 0.0])):  # stage 1: a_llm 0.88 > p 0.5
    ...     _ = torch.nn.init.zeros_(model.head[1].weight), model.head[1].bias.data.copy_(torch.tensor(bias))
    >>> folder = tempfile.TemporaryDirectory()
    >>> cascade = hf_defer.DeferralCascade(stage1, stage2, "llm", {"model": 1, "llm": 10, "person": 100})
    >>> cascade.save_pretrained(folder.name)
    >>> cascade = pipeline("deferral-cascade", model=folder.name, device="cpu", experts={
    ...     "llm": lambda rows: np.tile([0.1, 0.9], (len(rows), 1)), "person": lambda rows: [0] * len(rows)})
    >>> out = cascade([0.0, 0.0], stage2_costs=[0.0, 0.1])  # stage 2: a_person 0.5 - 0.1 < a_llm 0.5, keep
    >>> out["answered_by"], out["experts_called"], out["paid"], out["label"]
    ('llm', ['llm'], 11.0, 'LABEL_1')
    >>> folder.cleanup()

    ```
    """

    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        model = kwargs.get("model", args[0] if args else None)
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type != "deferral":
            raise ValueError(f"the {CASCADE_TASK!r} pipeline needs a cascade folder's stage 1 (a deferral model), got "
                             f"{type(model).__name__} with model_type={model_type!r}.")
        given = sorted(name for name in ("inputs", *_NOT_OPTIONS) if kwargs.get(name) is not None)
        if given:
            raise TypeError(f"the {CASCADE_TASK!r} pipeline takes no {given} when built: `inputs` goes with each call, "
                            "and the whole call is one batch (each expert is called once on the inputs routed to it).")
        check_device(kwargs.get("device"))
        self.cascade_folder = _cascade_folder(model)
        config = read_cascade_config(self.cascade_folder)
        first, second = cascade_stage_folders(self.cascade_folder, config)
        if first.resolve() != Path(model.name_or_path).resolve():
            raise ValueError(f"the model was loaded from {model.name_or_path!r}, but the cascade's stage 1 is "
                             f"{str(first)!r} ({CASCADE_CONFIG_NAME} 'stages'): pass model={str(first)!r}.")
        self.cascade = DeferralCascade(model, EncoderForDeferral.from_pretrained(second), **cascade_options(config))
        self.experts: dict[str, Callable[[list[Any]], Any]] = self._check_experts(kwargs.pop("experts", None))
        super().__init__(*args, **kwargs)
        self.cascade.stage2.to(self.model.device)

    def _check_experts(self, experts: Any) -> dict[str, Callable[[list[Any]], Any]]:
        if experts is None:
            return {}
        if not isinstance(experts, Mapping):
            raise TypeError(f"experts must be a mapping from expert names {self.cascade.expert_names} to callables on "
                            f"a list of inputs, got {type(experts).__name__}.")
        unknown = sorted(set(experts) - set(self.cascade.expert_names), key=str)
        if unknown:
            raise ValueError(f"experts names {unknown}, which are not experts of the cascade "
                             f"{self.cascade.expert_names}.")
        wrong = sorted(name for name, expert in experts.items() if not callable(expert))
        if wrong:
            raise TypeError(f"experts must map each name to a callable on a list of inputs; {wrong} are not callable.")
        return dict(experts)

    def _sanitize_parameters(self, experts: Any = None, stage1_costs: Any = None, stage2_costs: Any = None,
                             stage1_threshold: Any = None, stage2_threshold: Any = None,
                             stage2_min_confidence: Any = None, **unknown: Any) -> tuple[dict, dict, dict]:
        if unknown:
            raise TypeError(f"the {CASCADE_TASK!r} pipeline got unknown option(s) {sorted(unknown)}. Valid options: "
                            "['experts', 'inputs', 'stage1_costs', 'stage1_threshold', 'stage2_costs', "
                            "'stage2_min_confidence', 'stage2_threshold'].")
        c1, c2 = self.cascade.stage1.config, self.cascade.stage2.config
        forward: dict[str, Any] = {}
        if experts is not None:
            forward["experts"] = self._check_experts(experts)
        if stage1_costs is not None:
            forward["stage1_costs"] = check_expert_costs(stage1_costs, c1.num_experts, "stage1_costs")
        if stage2_costs is not None:
            forward["stage2_costs"] = check_expert_costs(stage2_costs, c2.num_experts, "stage2_costs")
        for name, value in (("stage1_threshold", stage1_threshold), ("stage2_threshold", stage2_threshold)):
            if value is not None:
                try:
                    forward[name] = check_defer_threshold(value)
                except ValueError:
                    raise ValueError(f"{name} must be a finite number, got {value!r}.") from None
        if stage2_min_confidence is not None:
            forward["stage2_min_confidence"] = check_min_confidence(stage2_min_confidence)
        return {}, forward, {}

    def __call__(self, features: Any, **kwargs: Any) -> dict[str, Any] | list[dict[str, Any]]:
        """Runs the cascade on the feature vector(s), or on the experts' inputs where it reads no feature vectors.

        Args:
            features: a 2-D array or tensor `[N, input_size]`, a list of vectors, or one vector; for a cascade of input
                width 0, a list of inputs or one input (what the experts read).
            kwargs: `inputs`, `experts`, `stage1_costs`, `stage2_costs`, `stage1_threshold`, `stage2_threshold`,
                `stage2_min_confidence` (see the class docstring).

        Returns:
            A `dict` for one input, a list of them (one per row) otherwise.
        """
        given = sorted(name for name in _NOT_OPTIONS if name in kwargs)
        if given:
            raise TypeError(f"the {CASCADE_TASK!r} pipeline takes no {given}: the whole call is one batch (each expert "
                            "is called once on the inputs routed to it).")
        return super().__call__(_CascadeBatch(features, kwargs.pop("inputs", None)), **kwargs)

    def preprocess(self, batch: _CascadeBatch) -> dict[str, _CascadeBatch]:
        size = self.cascade.input_size
        features = batch.features
        if size == 0:  # the cascade reads only its experts' probabilities: the inputs are what the experts read
            if batch.items is not None:
                raise TypeError("this cascade reads no feature vectors (stage 1 reads the first expert's "
                                "probabilities only): pass what the experts read as the first argument, not inputs=.")
            items = list(features) if isinstance(features, (list, tuple)) else [features]
            if not items:
                raise ValueError("inputs must hold at least one input, got an empty list.")
            single = not isinstance(features, (list, tuple))
            return {"batch": _CascadeBatch(np.zeros((len(items), 0), dtype=np.float32), items, single)}
        if isinstance(features, (str, bytes, dict)) or not isinstance(features, (list, tuple, np.ndarray,
                                                                                  torch.Tensor)):
            raise TypeError("features must be feature vectors: a 2-D array or tensor, a list of vectors or one vector, "
                            f"got {type(features).__name__}.")
        if isinstance(features, (list, tuple)):
            features = [row.detach().cpu().numpy() if isinstance(row, torch.Tensor) else row for row in features]
        elif isinstance(features, torch.Tensor):
            features = features.detach().cpu().numpy()
        try:
            array = np.asarray(features, dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise ValueError(f"features must be numbers, {size} per vector, got {batch.features!r:.80} ({err}).") \
                from None
        single = array.ndim == 1
        array = array[None] if single else array
        if array.ndim != 2 or array.shape[1] != size or len(array) == 0:
            raise ValueError(f"features must be one vector of {size} numbers or a non-empty batch of them [N, {size}], "
                             f"got shape {np.shape(features)}.")
        if not np.isfinite(array).all():
            raise ValueError("features must be finite (no NaN or inf).")
        items = batch.items
        if items is None:
            items = list(array)
        elif single:
            items = [items]
        else:
            if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__len__") or len(items) != len(array):
                count = len(items) if hasattr(items, "__len__") and not isinstance(items, (str, bytes, dict)) else \
                    type(items).__name__
                raise ValueError(f"inputs must give the experts one input per feature vector ({len(array)}), got "
                                 f"{count}.")
            items = list(items)
        return {"batch": _CascadeBatch(array, items, single)}

    def _forward(self, model_inputs: dict[str, _CascadeBatch], experts: Mapping[str, Callable] | None = None,
                 **options: Any) -> dict[str, Any]:
        batch = model_inputs["batch"]
        experts = {**self.experts, **(experts or {})}
        missing = [name for name in self.cascade.expert_names if name not in experts]
        if missing:
            raise ValueError(f"the cascade needs a callable for every expert {self.cascade.expert_names}; missing "
                             f"{missing}: give experts={{name: callable}} when building the pipeline or at call time.")
        outputs = self.cascade(batch.features, experts, inputs=batch.items, **options)
        return {"outputs": outputs, "single": batch.single}

    def postprocess(self, model_outputs: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        outputs = model_outputs["outputs"]
        return outputs[0] if model_outputs["single"] else outputs

    def save_pretrained(self, save_directory: str | os.PathLike, overwrite: bool = False) -> None:
        """Saves the whole cascade ([`DeferralCascade.save_pretrained`]): stage 1 at the folder's root, stage 2 in
        `stage2/`, `cascade_config.json`. The experts are not saved: give them again when loading."""
        self.cascade.save_pretrained(save_directory, overwrite=overwrite)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: the pipeline loads a cascade from a local folder only. Save it with `save_pretrained` and
        upload the folder (`huggingface_hub.upload_folder`); users download it (`snapshot_download`) before loading."""
        raise NotImplementedError(
            f"push_to_hub of the {CASCADE_TASK!r} pipeline is not supported (it would upload stage 1 alone): save the "
            "cascade with save_pretrained(folder) and upload the whole folder with huggingface_hub.upload_folder."
        )


def _register() -> None:
    """`pipeline("deferral-cascade", model=cascade_folder, experts=...)` builds a [`DeferralCascadePipeline`] (stage 1
    at the folder's root, stage 2 and cascade_config.json read by the pipeline)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    from ..hub.auto import AutoModelForDeferral

    if PIPELINE_REGISTRY.supported_tasks.get(CASCADE_TASK, {}).get("impl") is not DeferralCascadePipeline:
        PIPELINE_REGISTRY.register_pipeline(CASCADE_TASK, pipeline_class=DeferralCascadePipeline,
                                            pt_model=AutoModelForDeferral)


_register()
