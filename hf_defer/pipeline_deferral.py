"""The ``"deferral"`` pipeline: predict a class or hand the input to the expert most likely to be right.

This module imports only ``numpy``, ``torch`` and ``transformers``: it is copied next to the weights for
remote-code loading (``pipeline(model=..., trust_remote_code=True)``) and must stay free of ``hf_defer`` imports.
Registration of the task happens in ``hf_defer/__init__.py``.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterator, Sized
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import Pipeline
from transformers.dynamic_module_utils import custom_object_save
from transformers.pipelines.pt_utils import PipelineDataset, PipelineIterator

DEFER_LABEL = "defer"
"""The ``"label"`` of a deferred input."""

CUSTOM_PIPELINES: dict[str, dict[str, Any]] = {
    "deferral": {"impl": "pipeline_deferral.DeferralPipeline", "pt": ["AutoModel"], "tf": [], "type": "multimodal"}
}
"""The ``custom_pipelines`` entry of ``config.json`` that remote-code loading reads."""


@contextmanager
def custom_pipelines_in_config(model: Any) -> Iterator[None]:
    """Within this context, ``model.save_pretrained`` writes what remote-code loading needs.

    Registers the model and config classes for `AutoModel`/`AutoConfig` (so ``save_pretrained`` copies their modules
    and writes ``auto_map``) and adds the ``"deferral"`` entry to ``config.custom_pipelines``, removed again on exit:
    the in-memory config stays as it was. The pipeline module itself is copied by ``custom_object_save``.

    Args:
        model ([`EncoderForDeferral`]): the model to save.
    """
    if getattr(getattr(model, "config", None), "model_type", None) != "deferral":
        raise ValueError(
            f"model must be a deferral model (config.model_type == 'deferral'), got {type(model).__name__}."
        )
    type(model).register_for_auto_class("AutoModel")
    type(model.config).register_for_auto_class()
    config = model.config
    had, previous = "custom_pipelines" in config.__dict__, config.__dict__.get("custom_pipelines")
    config.custom_pipelines = {**(previous or {}), **copy.deepcopy(CUSTOM_PIPELINES)}
    try:
        yield
    finally:
        if had:
            config.custom_pipelines = previous
        else:
            del config.custom_pipelines


def deferral_margin(class_score: float, expert_accuracy: Any, expert_costs: Any = None) -> tuple[float, int]:
    """The cost-sensitive deferral margin of one input and the expert it would go to.

    The margin is ``max_j (expert_accuracy_j - cost_j) - class_score``; the pipeline defers when it exceeds the
    threshold. This one function serves the pipeline and [`calibrate_deferral`], so both compare the very same
    floating-point numbers.

    Args:
        class_score (`float`): estimated probability of the top class.
        expert_accuracy (sequence of `float`): estimated accuracy of each expert.
        expert_costs (sequence of `float`, *optional*): cost of asking each expert; zeros when `None`.

    Returns:
        `tuple(float, int)`: the margin and the index of the best expert (the first one on ties).

    Example:

    ```python
    >>> from hf_defer.pipeline_deferral import deferral_margin
    >>> deferral_margin(0.5, [0.75, 0.875], expert_costs=[0.0, 0.25])
    (0.25, 0)

    ```
    """
    gains = np.asarray(expert_accuracy, dtype=np.float64)
    if expert_costs is not None:
        gains = gains - np.asarray(expert_costs, dtype=np.float64)
    best = int(np.argmax(gains))
    return float(gains[best] - float(class_score)), best


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _is_sequence_like(value: Any) -> bool:
    """A sized, indexable batch that is not one of the input types themselves (a `datasets` Column, a deque...)."""
    if isinstance(value, (str, bytes, dict, list, tuple, np.ndarray, torch.Tensor)) or hasattr(value, "column_names"):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and hasattr(value, "__iter__")


def _stack_features(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"features": torch.cat([item["features"] for item in items], dim=0)}


class DeferralPipeline(Pipeline):
    r"""
    Learning-to-defer pipeline using any deferral model ([`EncoderForDeferral`], `model_type="deferral"`).

    For each input it either predicts a class or defers to an expert. With the model's estimates of the class
    posterior `p(y|x)` and of each expert's accuracy `a_j(x) = Pr(M_j = Y | x)`, and a cost `c_j` for asking
    expert `j`, it follows the cost-sensitive Bayes rule

        defer  iff  max_j (a_j(x) - c_j) - max_y p(y|x) > defer_threshold,

    and then to `argmax_j (a_j(x) - c_j)`. This compares *probabilities*, which is the point of calibrated
    estimates: costs and thresholds are in units of probability. The model's own `defer` output compares logits
    instead. With zero costs and threshold the two rules agree for the bounded estimators (`asm`, `aova`); the
    unbounded ones (`ssm`, `sova`) are clipped into [0, 1], and where clipped estimates tie at 1 the rules can differ.

    Inputs: a text, a text pair `{"text": ..., "text_pair": ...}`, an image (PIL image, path or URL) for a vision
    encoder, or a feature vector (list, `np.ndarray` or `torch.Tensor` of length `feature_size`) for a head-only
    model; or a list of them (a 2-D array of feature vectors), a `Dataset` or a generator.

    Each input gives a `dict`:

    - **label** (`str`) -- the predicted class name, or `"defer"`.
    - **defer** (`bool`) -- whether the input goes to an expert.
    - **expert** (`str` or `None`) -- the chosen expert's name (`config.expert_names`), `None` when not deferred.
    - **class_label** (`str`) / **class_score** (`float`) -- the top class and its estimated probability.
    - **expert_accuracy** (`list[float]`) -- the estimated accuracy of each expert.
    - **scores** (`dict[str, float]`) -- class name to probability, highest first (`top_k` of them).

    Experts that are models (library mode): `pipeline("deferral", model=..., experts={name: predictor})`, with a
    transformers pipeline, a `(model, tokenizer)` pair or a callable on a list of inputs for some of
    `config.expert_names`. The inputs routed to such an expert are sent to it in batches and its answer becomes
    the `label`; every output then also has **answered_by** (`"classifier"`, the model expert's name, or `None`
    while a person has not answered) and **cost** (the chosen expert's cost, 0 when the classifier answers).
    Nothing is called for the inputs the model keeps.

    Call parameters (also accepted when building the pipeline):

    - **top_k** (`int`, *optional*) -- how many classes `scores` keeps; all when `None`.
    - **expert_costs** (sequence of `float`, *optional*) -- one cost per expert; `config.expert_costs` by default.
    - **defer_threshold** (`float`, *optional*) -- the margin; defaults to `model.config.defer_threshold`, which
      [`calibrate_deferral`] sets to meet a deferral budget.
    - tokenizer keyword arguments (`truncation`, `max_length`, `padding`, ...) for text, image-processor ones for
      images, as in the text-classification pipeline; `batch_size` batches the forward passes.

    Example:

    ```python
    >>> import hf_defer
    >>> from transformers import pipeline
    >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    >>> defer = pipeline("deferral", model=model)
    >>> out = defer([0.1, -0.3, 0.2, 0.0], expert_costs=[0.05])
    >>> sorted(out)
    ['class_label', 'class_score', 'defer', 'expert', 'expert_accuracy', 'label', 'scores']

    ```
    """

    _load_processor = False
    _load_image_processor = None
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = None
    model_expert_runner: Any = None
    """Set by `import hf_defer` to `hf_defer.model_experts.answer_with_model_experts` (library mode only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        model = kwargs.get("model", args[0] if args else None)
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type != "deferral":
            raise ValueError(
                "The deferral pipeline needs a deferral model (config.model_type == 'deferral', e.g. "
                f"hf_defer.EncoderForDeferral), got {type(model).__name__} with model_type={model_type!r}."
            )
        experts = dict(kwargs.pop("experts", None) or {})
        super().__init__(*args, **kwargs)
        config = self.model.config
        unknown = sorted(set(experts) - set(config.expert_names))
        if unknown:
            raise ValueError(f"experts names {unknown}, which are not in config.expert_names {config.expert_names}.")
        self.model_experts = experts
        if config.encoder is None:
            self.input_kind = "features"
        elif self.model.main_input_name == "pixel_values":
            self.input_kind = "image"
            if self.image_processor is None:
                raise ValueError(
                    "This deferral model has a vision encoder: pass image_processor= to the pipeline (or save one "
                    "next to the model)."
                )
        else:
            self.input_kind = "text"
            if self.tokenizer is None:
                raise ValueError(
                    "This deferral model has a text encoder: pass tokenizer= to the pipeline (or save one next to "
                    "the model)."
                )

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Saves the model (safetensors), its tokenizer or image processor and the code that loads them, so that the
        folder works in library mode (`pipeline("deferral", model=folder)`) and in remote-code mode
        (`pipeline(model=folder, trust_remote_code=True)`, no hf_defer needed).

        Args:
            save_directory (`str` or `os.PathLike`): the folder; created if missing.
            kwargs: passed to each component's `save_pretrained`.
        """
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory must be a directory, got the file {str(save_directory)!r}.")
        os.makedirs(save_directory, exist_ok=True)
        with custom_pipelines_in_config(self.model):
            self.model.save_pretrained(save_directory, **kwargs)
        custom_object_save(self, save_directory)
        for component in (self.tokenizer, self.image_processor):
            if component is not None:
                component.save_pretrained(save_directory, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Uploads the model, its tokenizer or image processor, the deferral model card and the code for remote
        loading: `model.push_to_hub(repo_id, processing_class=..., **kwargs)` (see [`EncoderForDeferral.push_to_hub`]).
        """
        processing_class = self.tokenizer if self.tokenizer is not None else self.image_processor
        return self.model.push_to_hub(repo_id, processing_class=processing_class, **kwargs)

    # ------------------------------------------------------------------ parameters
    def _sanitize_parameters(
        self,
        top_k: int | None | str = "",
        expert_costs: Any = None,
        defer_threshold: float | None = None,
        **processor_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        postprocess: dict[str, Any] = {}
        if top_k != "":
            if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
                raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}.")
            postprocess["top_k"] = top_k
        if expert_costs is not None:
            num_experts = self.model.config.num_experts
            if isinstance(expert_costs, (np.ndarray, torch.Tensor)):
                expert_costs = expert_costs.tolist()
            if isinstance(expert_costs, (str, bytes, dict)) or not hasattr(expert_costs, "__len__"):
                raise TypeError(
                    f"expert_costs must be a sequence of {num_experts} numbers, got {type(expert_costs).__name__}."
                )
            costs = list(expert_costs)
            if len(costs) != num_experts:
                raise ValueError(
                    f"expert_costs must have one cost per expert (num_experts={num_experts}), got {len(costs)}: "
                    f"{list(expert_costs)!r}."
                )
            if not all(_is_number(cost) and math.isfinite(cost) and cost >= 0 for cost in costs):
                raise ValueError(f"expert_costs must be finite, non-negative numbers, got {list(expert_costs)!r}.")
            postprocess["expert_costs"] = [float(cost) for cost in costs]
        if defer_threshold is not None:
            if not _is_number(defer_threshold) or not math.isfinite(defer_threshold):
                raise ValueError(f"defer_threshold must be a finite number, got {defer_threshold!r}.")
            postprocess["defer_threshold"] = float(defer_threshold)
        return processor_kwargs, {}, postprocess

    # ------------------------------------------------------------------ inputs
    def _is_single(self, inputs: Any) -> bool:
        """Whether ``inputs`` is one input (rather than a batch) for this model."""
        if self.input_kind == "features":
            if isinstance(inputs, dict):
                return True
            if isinstance(inputs, (np.ndarray, torch.Tensor)):
                return inputs.ndim == 1
            return isinstance(inputs, (list, tuple)) and len(inputs) > 0 and all(_is_number(v) for v in inputs)
        if self.input_kind == "image":
            return isinstance(inputs, str) or hasattr(inputs, "convert")  # a path/URL or a PIL image
        return isinstance(inputs, (str, dict))

    def __call__(self, inputs: Any, **kwargs: Any) -> dict[str, Any] | list[dict[str, Any]]:
        """Predicts or defers for the input(s).

        Args:
            inputs: one input or a batch of them (see the class docstring).
            kwargs: `top_k`, `expert_costs`, `defer_threshold`, `batch_size` and tokenizer/image-processor kwargs.

        Returns:
            A `dict` for one input, a list of them for a list (an iterator for a dataset or generator; a list when
            the pipeline has model experts).
        """
        if self.model_experts:
            return self._call_with_model_experts(inputs, **kwargs)
        if isinstance(inputs, (np.ndarray, torch.Tensor)) and self.input_kind == "features" and inputs.ndim == 2:
            inputs = list(inputs)
        elif _is_sequence_like(inputs):  # e.g. a `datasets` Column, `dataset["text"]`
            inputs = list(inputs)
        if self._is_single(inputs):
            if isinstance(inputs, (list, tuple)):  # one feature vector, not a batch of numbers
                inputs = np.asarray(inputs, dtype=np.float32)
            return super().__call__(inputs, **kwargs)
        if isinstance(inputs, tuple):
            inputs = list(inputs)
        if isinstance(inputs, list) and not inputs:
            raise ValueError("inputs is an empty batch: give at least one input.")
        return super().__call__(inputs, **kwargs)

    def _call_with_model_experts(self, inputs: Any, **kwargs: Any) -> dict[str, Any] | list[dict[str, Any]]:
        """Runs the deferral model, then each model expert once per batch of the inputs routed to it."""
        runner = type(self).model_expert_runner
        if runner is None:  # remote-code mode: the helper is not copied next to the weights
            raise ImportError("model experts (`experts=`) need the hf_defer library: `pip install hf-defer` and "
                              "`import hf_defer`.")
        single = self._is_single(inputs)
        items = [inputs] if single else list(inputs)
        self.model_experts, saved = {}, self.model_experts
        try:
            outputs = self(items, **kwargs)
        finally:
            self.model_experts = saved
        costs = self._sanitize_parameters(expert_costs=kwargs.get("expert_costs"))[2].get("expert_costs")
        costs = costs or self._postprocess_params.get("expert_costs") or self.model.config.expert_costs
        batch_size = kwargs.get("batch_size") or self._batch_size or 32
        outputs = runner(outputs, items, self.model_experts, self.model.config, costs, batch_size)
        return outputs[0] if single else outputs

    def preprocess(self, inputs: Any, **processor_kwargs: Any) -> dict[str, torch.Tensor]:
        if self.input_kind == "features":
            if isinstance(inputs, dict):
                if set(inputs) != {"features"}:
                    raise ValueError(
                        f"a dict input of a head-only model must be {{'features': vector}}, got keys {sorted(inputs)}."
                    )
                inputs = inputs["features"]
            if isinstance(inputs, str) or not isinstance(inputs, (list, tuple, np.ndarray, torch.Tensor)):
                raise TypeError(
                    "inputs of a head-only deferral model must be feature vectors (list, np.ndarray or torch.Tensor), "
                    f"got {type(inputs).__name__}."
                )
            if processor_kwargs:
                raise ValueError(
                    f"a head-only model takes no tokenizer/processor arguments, got {sorted(processor_kwargs)}."
                )
            features = torch.as_tensor(np.asarray(inputs, dtype=np.float32))
            size = self.model.config.feature_size
            if features.shape != (size,):
                raise ValueError(f"each feature vector must have shape ({size},), got {tuple(features.shape)}.")
            return {"features": features[None]}
        if self.input_kind == "image":
            from transformers.image_utils import load_image

            if not isinstance(inputs, str) and not hasattr(inputs, "convert"):
                raise TypeError(
                    f"inputs of a vision deferral model must be images (PIL, path or URL), got {type(inputs).__name__}."
                )
            return self.image_processor(images=load_image(inputs), return_tensors="pt", **processor_kwargs)
        if isinstance(inputs, dict):
            if not {"text"} <= set(inputs) <= {"text", "text_pair"}:
                raise ValueError(
                    'a dict input must be {"text": ..., "text_pair": ...} (text pair), got keys '
                    f"{sorted(inputs)}."
                )
            if not all(isinstance(value, str) for value in inputs.values()):
                raise TypeError("the text and text_pair of a dict input must be strings.")
            return self.tokenizer(**inputs, return_tensors="pt", **processor_kwargs)
        if not isinstance(inputs, str):
            raise TypeError(
                'inputs of a text deferral model must be str, {"text": ..., "text_pair": ...} or a list of them, '
                f"got {type(inputs).__name__}."
            )
        return self.tokenizer(inputs, return_tensors="pt", **processor_kwargs)

    def get_iterator(self, inputs: Any, num_workers: int, batch_size: int, preprocess_params: dict,
                     forward_params: dict, postprocess_params: dict) -> Any:
        if self.input_kind != "features" or batch_size == 1:
            return super().get_iterator(
                inputs, num_workers, batch_size, preprocess_params, forward_params, postprocess_params
            )
        # Feature vectors need no padding, and the base collator insists on a tokenizer: stack them instead.
        dataset_class = PipelineDataset if isinstance(inputs, Sized) else PipelineIterator
        dataset = dataset_class(inputs, self.preprocess, preprocess_params)
        loader = DataLoader(dataset, num_workers=num_workers, batch_size=batch_size, collate_fn=_stack_features)
        model_iterator = PipelineIterator(loader, self.forward, forward_params, loader_batch_size=batch_size)
        return PipelineIterator(model_iterator, self.postprocess, postprocess_params)

    # ------------------------------------------------------------------ model and decision
    def _forward(self, model_inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "pixel_values" in model_inputs:
            model_inputs["pixel_values"] = model_inputs["pixel_values"].to(self.model.dtype)
        outputs = self.model(**model_inputs, return_dict=True)
        return {"class_probs": outputs.class_probs, "expert_accuracy": outputs.expert_accuracy}

    def postprocess(
        self,
        model_outputs: dict[str, torch.Tensor],
        top_k: int | None = None,
        expert_costs: list[float] | None = None,
        defer_threshold: float | None = None,
    ) -> dict[str, Any]:
        config = self.model.config
        probs = model_outputs["class_probs"][0].float().numpy()
        accuracy = [float(a) for a in model_outputs["expert_accuracy"][0].float().numpy()]
        threshold = float(config.defer_threshold) if defer_threshold is None else defer_threshold
        if expert_costs is None:
            expert_costs = getattr(config, "expert_costs", None)
        top = int(np.argmax(probs))
        class_score = float(probs[top])
        margin, expert = deferral_margin(class_score, accuracy, expert_costs)
        defer = margin > threshold
        order = sorted(range(len(probs)), key=lambda k: -probs[k])[:top_k]
        return {
            "label": DEFER_LABEL if defer else config.id2label[top],
            "defer": defer,
            "expert": config.expert_names[expert] if defer else None,
            "class_label": config.id2label[top],
            "class_score": class_score,
            "expert_accuracy": accuracy,
            "scores": {config.id2label[k]: float(probs[k]) for k in order},
        }


__all__ = ["CUSTOM_PIPELINES", "DEFER_LABEL", "DeferralPipeline", "custom_pipelines_in_config", "deferral_margin"]
