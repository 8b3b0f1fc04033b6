"""The ``"deferral"`` pipeline: predict a class or hand the input to the expert most likely to be right.

This module imports only ``numpy``, ``torch``, ``transformers`` and its siblings: it is copied next to the weights for
remote-code loading (``pipeline(model=..., trust_remote_code=True)``) and must stay free of ``hf_defer`` imports.
Registration of the task happens in ``hf_defer/__init__.py``. The decision is the model's surrogate's
(`DeferralSurrogate.decide`), the one rule that the model output, the metrics and calibration use too.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import Pipeline
from transformers.pipelines.pt_utils import PipelineDataset, PipelineIterator

from .availability import InputWithAvailability, parse_available_experts, with_availability
from .cascade_folder import refuse_cascade_folder
from .device import check_device
from .guarantee_warnings import warn_outside_calibration, warn_outside_guarantee
from .library_mode import library_function
from .surrogate_base import check_defer_threshold, check_expert_costs
from .surrogate_routing import is_route_only, route_only_output
from .validators import CLASSIFIER_ANSWER, DEFER_LABEL, is_int, is_number


REMOTE_TASK = "deferral-remote-code"
"""The task name under which ``config.json`` lists the pipeline for remote code.

It differs from the library's task ``"deferral"`` on purpose: `transformers.pipeline` gives a task listed in
``config.custom_pipelines`` precedence over its registry and then demands ``trust_remote_code=True``, so the same
name would stop ``pipeline("deferral", model=folder)`` from using the installed library. Remote code never needs the
name: ``pipeline(model=folder, trust_remote_code=True)`` infers it.
"""

CUSTOM_PIPELINES: dict[str, dict[str, Any]] = {
    REMOTE_TASK: {"impl": "pipeline_deferral.DeferralPipeline", "pt": ["AutoModel"], "tf": [], "type": "multimodal"}
}
"""The ``custom_pipelines`` entry that [`EncoderForDeferral.save_pretrained`] writes into ``config.json``."""


# What the pipeline checks of its options and inputs before running: loader options, the tokenizer / image-processor
# keyword arguments it passes on, side features, and how feature vectors are batched (the device: device.py; expert
# availability: availability.py).


def _is_sequence_like(value: Any) -> bool:
    """A sized, indexable batch that is not one of the input types themselves (a `datasets` Column, a deque...)."""
    if isinstance(value, (str, bytes, dict, list, tuple, np.ndarray, torch.Tensor)) or hasattr(value, "column_names"):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and hasattr(value, "__iter__")


def _split_side_features(config: Any, inputs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """A model with side features (`config.side_features`) takes each input as a dict holding them beside its
    `text` (or `features`): the input without them, and the model's `side_categorical` / `side_numeric` for it."""
    specs = getattr(config, "side_features", None)
    if not specs or isinstance(inputs, _SideFeaturesTaken):
        return inputs, {}
    names = [spec["name"] for spec in specs]
    if not isinstance(inputs, dict):
        raise ValueError(f"this model takes the side features {names}: give each input as a dict, e.g. "
                         f"{{'text': ..., {names[0]!r}: ...}}, got {type(inputs).__name__}.")
    from .side_features import side_feature_tensors

    categorical, numeric = side_feature_tensors(specs, [inputs])
    rest = _SideFeaturesTaken({key: value for key, value in inputs.items() if key not in names})
    return rest, {"side_categorical": categorical, "side_numeric": numeric}


class _SideFeaturesTaken(dict):
    """An input dict whose side features were taken out (preprocessing it again does not look for them)."""


def _stack_features(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([item[key] for item in items], dim=0) for key in items[0]}  # features (and availability)


# Tokenizer arguments the pipeline sets itself (the input, return_tensors) or that would change what the model receives
# (several rows per input, extra outputs the model does not take).
_RESERVED_TOKENIZER_ARGS = {"self", "text", "text_pair", "text_target", "text_pair_target", "return_tensors",
                            "is_split_into_words", "return_overflowing_tokens", "return_special_tokens_mask",
                            "return_offsets_mapping", "return_length", "tokenizer_kwargs"}


def _processor_options(processor: Any) -> set[str]:
    """The keyword arguments of a tokenizer's ``__call__`` (or an image processor's ``preprocess`` and its
    ``valid_kwargs``) that the pipeline passes on."""
    if hasattr(processor, "pad"):  # a tokenizer
        parameters = inspect.signature(processor.__call__).parameters
        reserved = _RESERVED_TOKENIZER_ARGS
    else:
        parameters = inspect.signature(processor.preprocess).parameters
        reserved = {"self", "images", "return_tensors", "image_like_kwargs"}
    named = {name for name, parameter in parameters.items()
             if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    typed = getattr(getattr(processor, "valid_kwargs", None), "__annotations__", {})  # v5 image processors
    return (named | set(typed)) - reserved


def _check_loader_options(options: dict[str, Any]) -> None:
    """``batch_size`` and ``num_workers``, which the base class hands to a `DataLoader` unchecked."""
    for name, least in (("batch_size", 1), ("num_workers", 0)):
        value = options.get(name)
        if value is not None and (not is_int(value) or value < least):
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")
        if value is not None:
            options[name] = int(value)  # a numpy integer reaches the DataLoader as a plain int (torch refuses it)


class DeferralPipeline(Pipeline):
    r"""
    Learning-to-defer pipeline using any deferral model ([`EncoderForDeferral`], `model_type="deferral"`).

    For each input it either predicts a class or defers to an expert. With the model's estimates of the class
    posterior `p(y|x)` and of each expert's accuracy `a_j(x) = Pr(M_j = Y | x)`, and a cost `c_j` for asking
    expert `j`, it follows the cost-sensitive Bayes rule

        defer  iff  max_j (a_j(x) - c_j) - max_y p(y|x) > defer_threshold,

    and then to `argmax_j (a_j(x) - c_j)` ([`DeferralSurrogate.decide`], the rule of the model's `defer` output and of
    [`deferral_metrics`] too). This compares *probabilities*, which is the point of calibrated estimates: costs and
    thresholds are in units of probability. With zero costs and threshold it is exactly the logit rule
    `max_j u_{K+j} > max_y u_y`. The unbounded estimators (`ssm`, `sova`) enter the margin unclipped (their
    `expert_accuracy` and `scores` below are clipped into [0, 1]).

    Inputs: a text, a text pair `{"text": ..., "text_pair": ...}`, an image (PIL image, path or URL) for a vision
    encoder, or a feature vector (list, `np.ndarray` or `torch.Tensor` of length `feature_size`) for a head-only
    model; or a list of them (a 2-D array of feature vectors), a `Dataset` or a generator.

    Each input gives a `dict`:

    - **label** (`str`) -- the predicted class name, or `"defer"`.
    - **defer** (`bool`) -- whether the input goes to an expert.
    - **expert** (`str` or `None`) -- the chosen expert's name (`config.expert_names`), `None` when not deferred.
    - **class_label** (`str`) / **class_score** (`float`) -- the top class and its estimated probability.
    - **expert_accuracy** (`list[float]`) -- the estimated accuracy of each expert.
    - **expert_scores** (`dict[str, float]`) -- the same, by expert name (`config.expert_names`).
    - **scores** (`dict[str, float]`) -- class name to probability, highest first (`top_k` of them).
    - **expert_costs** (`list[float]`) / **defer_threshold** (`float`) -- the costs and threshold this decision was
      made with (the call's, else the config's). A call whose costs or threshold differ from those the model's
      threshold was calibrated for (`config.calibrated_expert_costs`, or its `deferral_guarantee`) warns.

    Experts that are models (library mode): `pipeline("deferral", model=..., experts={name: predictor})`, with a
    transformers pipeline, a `(model, tokenizer)` pair or a callable on a list of inputs for some of
    `config.expert_names`. The inputs routed to such an expert are sent to it in batches and its answer becomes
    the `label`; every output then also has **answered_by** (`"classifier"`, the model expert's name, or `None`
    while a person has not answered) and **cost** (the chosen expert's cost, 0 when the classifier answers).
    Nothing is called for the inputs the model keeps.

    Call parameters (also accepted when building the pipeline):

    - **top_k** (`int`, *optional*) -- how many classes `scores` keeps; all when `None`.
    - **expert_costs** (sequence of `float`, *optional*) -- one cost per expert; defaults to
      `model.config.expert_costs` (zeros when unset).
    - **defer_threshold** (`float`, *optional*) -- the margin; defaults to `model.config.defer_threshold`, which
      [`calibrate_deferral`] sets to meet a deferral budget.
    - **return_margin** (`bool`, *optional*, defaults to `False`) -- add **margin** (`float`), the deferral margin
      `max_j (a_j - c_j) - max_y p(y|x)` that the threshold is compared with.
    - **available_experts** (*optional*) -- who can answer now: expert names (or a bool mask over
      `config.expert_names`) for every input of the call, or, for a list of inputs, one such entry per input (a 2-D
      mask, or a list of name lists). Only those enter the max of the rule; an input with none is answered by the
      model (`margin` `-inf`). All experts when not given. A route-only model obeys it for its default expert too:
      left out, the input goes to the best available other expert (`margin` `+inf`); with nobody left, a
      `ValueError`.
    - tokenizer keyword arguments (`truncation`, `max_length`, `padding`, ...) for text, image-processor ones for
      images, as in the text-classification pipeline; `batch_size` batches the forward passes.

    Any other option is refused with a `TypeError` that lists the valid ones (those of `_sanitize_parameters` and
    the named arguments of the tokenizer's `__call__` or the image processor's `preprocess`), and `max_length`
    needs `truncation=True` (or `padding="max_length"`). A `device` this machine lacks is a `ValueError`.

    Example:

    ```python
    >>> import hf_defer
    >>> from transformers import pipeline
    >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    >>> defer = pipeline("deferral", model=model)
    >>> out = defer([0.1, -0.3, 0.2, 0.0], expert_costs=[0.05])
    >>> sorted(out)
    ['class_label', 'class_score', 'defer', 'defer_threshold', 'expert', 'expert_accuracy', 'expert_costs', 'expert_scores', 'label', 'scores']
    >>> out["expert_costs"], out["defer_threshold"]  # what decided: the call's costs, the config's threshold
    ([0.05], 0.0)
    >>> defer([0.1, -0.3, 0.2, 0.0], available_experts=[])["defer"]  # nobody to ask: the model answers
    False

    ```
    """

    _load_processor = False
    _load_image_processor = None
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        model = kwargs.get("model", args[0] if args else None)
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type != "deferral":
            raise ValueError(
                "The deferral pipeline needs a deferral model (config.model_type == 'deferral', e.g. "
                f"hf_defer.EncoderForDeferral), got {type(model).__name__} with model_type={model_type!r}."
            )
        refuse_cascade_folder(model)  # a cascade folder's root is its stage 1 alone
        experts = dict(kwargs.pop("experts", None) or {})
        unknown = sorted(set(experts) - set(model.config.expert_names))
        if unknown:
            raise ValueError(f"experts names {unknown}, which are not in config.expert_names {model.config.expert_names}.")
        self.model_experts = experts
        check_device(kwargs.get("device"))
        _check_loader_options(kwargs)
        if model.config.encoder is None:  # set before the base class checks the options with _sanitize_parameters
            self.input_kind = "features"
        else:
            self.input_kind = "image" if model.main_input_name == "pixel_values" else "text"
        super().__init__(*args, **kwargs)
        if self.input_kind == "image":
            if self.image_processor is None:
                raise ValueError(
                    "This deferral model has a vision encoder: pass image_processor= to the pipeline (or save one "
                    "next to the model)."
                )
        elif self.input_kind == "text":
            if self.tokenizer is None:
                raise ValueError(
                    "This deferral model has a text encoder: pass tokenizer= to the pipeline (or save one next to "
                    "the model)."
                )

    def save_pretrained(self, save_directory: str | os.PathLike, overwrite: bool = False, **kwargs: Any) -> None:
        """Saves the model with [`EncoderForDeferral.save_pretrained`] (weights, config, remote code), then its tokenizer
        or image processor, so that the folder works in library mode (`pipeline("deferral", model=folder)`) and in
        remote-code mode (`pipeline(model=folder, trust_remote_code=True)`, no hf_defer needed).

        Args:
            save_directory (`str` or `os.PathLike`): the folder; created if missing.
            overwrite (`bool`, *optional*, defaults to `False`): see [`EncoderForDeferral.save_pretrained`].
            kwargs: passed to each component's `save_pretrained`.
        """
        self.model.save_pretrained(save_directory, overwrite=overwrite, **kwargs)
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
        return_margin: bool | None = None,
        available_experts: Any = None,
        **processor_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        postprocess: dict[str, Any] = {}
        if not (isinstance(top_k, str) and top_k == ""):  # "": not given (None means all classes)
            if top_k is not None and (not is_int(top_k) or top_k < 1):
                raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}.")
            postprocess["top_k"] = None if top_k is None else int(top_k)
        if expert_costs is not None:
            postprocess["expert_costs"] = check_expert_costs(expert_costs, self.model.config.num_experts)
        if defer_threshold is not None:
            postprocess["defer_threshold"] = check_defer_threshold(defer_threshold)
        if return_margin is not None:
            if not isinstance(return_margin, bool):
                raise ValueError(f"return_margin must be a bool, got {return_margin!r}.")
            postprocess["return_margin"] = return_margin
        if available_experts is not None:
            per_input, mask = parse_available_experts(available_experts, list(self.model.config.expert_names))
            if per_input:
                raise ValueError("available_experts given per input (one entry per input) must come with the call "
                                 "on a list of inputs, not when building the pipeline.")
            postprocess["available"] = mask
        warn_outside_guarantee(self.model.config, expert_costs, defer_threshold, postprocess.get("available"))
        warn_outside_calibration(self.model.config, expert_costs, defer_threshold)
        return self._check_processor_kwargs(processor_kwargs), {}, postprocess

    def _check_processor_kwargs(self, processor_kwargs: dict[str, Any]) -> dict[str, Any]:
        """Refuses an option that neither the pipeline nor its tokenizer (image processor) takes, listing the valid
        ones, and ``max_length`` without ``truncation`` or ``padding`` (the tokenizer would guess truncation)."""
        if not processor_kwargs:
            return processor_kwargs
        processor = {"text": self.tokenizer, "image": self.image_processor}.get(self.input_kind)
        if processor is None and self.input_kind != "features":
            return processor_kwargs  # __init__ reports the missing tokenizer or image processor
        accepted = set() if processor is None else _processor_options(processor)
        unknown = sorted(set(processor_kwargs) - accepted)
        if unknown:
            own = [name for name, parameter in inspect.signature(self._sanitize_parameters).parameters.items()
                   if parameter.kind is not inspect.Parameter.VAR_KEYWORD] + ["batch_size", "num_workers"]
            close = {name: difflib.get_close_matches(name, [*own, *accepted], n=1) for name in unknown}
            hint = "".join(f" Did you mean {match[0]!r} for {name!r}?" for name, match in close.items() if match)
            if processor is None:
                theirs = "; a head-only model takes no tokenizer or image-processor options"
            else:
                theirs = f", and those of its {type(processor).__name__}: {sorted(accepted)}"
            raise TypeError(
                f"the deferral pipeline got unknown option(s) {unknown}.{hint} Valid options: {sorted(own)}{theirs}."
            )
        merged = {**getattr(self, "_preprocess_params", {}), **processor_kwargs}
        if self.input_kind == "text" and merged.get("max_length") is not None and merged.get("truncation") is None \
                and merged.get("padding") in (None, False):
            raise ValueError(
                f"max_length={merged['max_length']} was given without truncation or padding: pass truncation=True to cut "
                "longer texts to max_length tokens, or padding='max_length' to pad shorter ones to it."
            )
        return processor_kwargs

    # ------------------------------------------------------------------ inputs
    def _is_single(self, inputs: Any) -> bool:
        """Whether ``inputs`` is one input (rather than a batch) for this model."""
        if self.input_kind == "features":
            if isinstance(inputs, dict):
                return True
            if isinstance(inputs, (np.ndarray, torch.Tensor)):
                return inputs.ndim == 1
            return isinstance(inputs, (list, tuple)) and len(inputs) > 0 and all(is_number(v) for v in inputs)
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
        _check_loader_options(kwargs)
        if self.model_experts:
            return self._call_with_model_experts(inputs, **kwargs)
        if isinstance(inputs, (np.ndarray, torch.Tensor)) and self.input_kind == "features" and inputs.ndim == 2:
            inputs = list(inputs)
        elif _is_sequence_like(inputs):  # e.g. a `datasets` Column, `dataset["text"]`
            inputs = list(inputs)
        single = self._is_single(inputs)
        if single and isinstance(inputs, (list, tuple)):  # one feature vector, not a batch of numbers
            inputs = np.asarray(inputs, dtype=np.float32)
        elif not single and isinstance(inputs, tuple):
            inputs = list(inputs)
        if not single and isinstance(inputs, list) and not inputs:
            raise ValueError("inputs is an empty batch: give at least one input.")
        if kwargs.get("available_experts") is not None:
            per_input, mask = parse_available_experts(kwargs["available_experts"], list(self.model.config.expert_names))
            if per_input:  # each input carries its own mask through preprocessing and batching to the decision
                kwargs = {key: value for key, value in kwargs.items() if key != "available_experts"}
                inputs = with_availability(inputs, mask, single)
        return super().__call__(inputs, **kwargs)

    def _call_with_model_experts(self, inputs: Any, **kwargs: Any) -> dict[str, Any] | list[dict[str, Any]]:
        """Runs the deferral model, then each model expert once per batch of the inputs routed to it."""
        runner = library_function("experts.model_experts", "answer_with_model_experts")
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
        costs = self.resolve_costs(kwargs.get("expert_costs"))
        batch_size = kwargs.get("batch_size") or self._batch_size or 32
        outputs = runner(outputs, items, self.model_experts, self.model.config, costs, batch_size)
        return outputs[0] if single else outputs

    def resolve_costs(self, expert_costs: Any = None) -> list[float] | None:
        """The costs a call decides with: `expert_costs` (checked), else those given when the pipeline was built,
        else `model.config.expert_costs`."""
        if expert_costs is not None:
            return check_expert_costs(expert_costs, self.model.config.num_experts)
        return self._postprocess_params.get("expert_costs", getattr(self.model.config, "expert_costs", None))

    def preprocess(self, inputs: Any, **processor_kwargs: Any) -> dict[str, torch.Tensor]:
        if isinstance(inputs, InputWithAvailability):
            model_inputs = self.preprocess(inputs.inputs, **processor_kwargs)
            model_inputs["available_experts"] = torch.as_tensor(inputs.available)[None]
            return model_inputs
        inputs, side = _split_side_features(self.model.config, inputs)
        if side:  # the model's side features, beside the text's (or features') own inputs
            return {**self.preprocess(inputs, **processor_kwargs), **side}
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
            size = self.model.config.feature_size
            try:
                features = torch.as_tensor(np.asarray(inputs, dtype=np.float32))
            except (TypeError, ValueError) as err:
                raise ValueError(f"each feature vector must be {size} numbers, got {inputs!r:.80} ({err}).") from None
            if features.shape != (size,):
                raise ValueError(f"each feature vector must have shape ({size},), got {tuple(features.shape)}.")
            if not torch.isfinite(features).all():
                raise ValueError(f"each feature vector must be finite, got {inputs!r:.80} (NaN, inf or None).")
            return {"features": features[None]}
        if self.input_kind == "image":
            from transformers.image_utils import load_image

            if not isinstance(inputs, str) and not hasattr(inputs, "convert"):
                raise TypeError(
                    f"inputs of a vision deferral model must be images (PIL, path or URL), got {type(inputs).__name__}."
                )
            return self._process(self.image_processor, {"images": load_image(inputs)}, processor_kwargs)
        if isinstance(inputs, dict):
            if not {"text"} <= set(inputs) <= {"text", "text_pair"}:
                raise ValueError('a dict input must be {"text": ..., "text_pair": ...} (text pair), got keys '
                                 f"{sorted(inputs)}.")
            if not all(isinstance(value, str) for value in inputs.values()):
                raise TypeError("the text and text_pair of a dict input must be strings.")
            return self._process(self.tokenizer, inputs, processor_kwargs)
        if not isinstance(inputs, str):
            raise TypeError(
                'inputs of a text deferral model must be str, {"text": ..., "text_pair": ...} or a list of them, '
                f"got {type(inputs).__name__}."
            )
        return self._process(self.tokenizer, {"text": inputs}, processor_kwargs)

    @staticmethod
    def _process(processor: Any, inputs: dict[str, Any], options: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The tokenizer or image processor on one input; its errors (a bad option value) name the options given."""
        try:
            return processor(**inputs, return_tensors="pt", **options)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{type(processor).__name__} refused the input with the options {options}: {err}") from err

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
        available = model_inputs.pop("available_experts", None)
        if "pixel_values" in model_inputs:
            model_inputs["pixel_values"] = model_inputs["pixel_values"].to(self.model.dtype)
        outputs = self.model(**model_inputs, return_dict=True)
        out = {"logits": outputs.logits, "class_probs": outputs.class_probs, "expert_accuracy": outputs.expert_accuracy}
        return out if available is None else {**out, "available_experts": available.cpu()}

    def postprocess(
        self,
        model_outputs: dict[str, torch.Tensor],
        top_k: int | None = None,
        expert_costs: list[float] | None = None,
        defer_threshold: float | None = None,
        return_margin: bool = False,
        available: np.ndarray | None = None,
    ) -> dict[str, Any]:
        config = self.model.config
        costs = getattr(config, "expert_costs", None) if expert_costs is None else expert_costs
        threshold = float(config.defer_threshold) if defer_threshold is None else defer_threshold
        surrogate = self.model.surrogate
        logits = model_outputs["logits"][:1].float()  # checked by the model's forward: the unchecked forms follow
        row = model_outputs.get("available_experts")  # this input's own, when given per input
        if available is not None:
            row = torch.as_tensor(available)[None] if row is None else row & torch.as_tensor(available)[None]
        used = {"expert_costs": [float(c) for c in (costs or [0.0] * config.num_experts)], "defer_threshold": threshold}
        if is_route_only(config):  # no class head: the chosen expert and its estimate
            return {**route_only_output(surrogate, config, logits, costs, threshold, row, return_margin), **used}
        paid = surrogate.check_costs(costs)
        defer, top, expert = (int(t[0]) for t in surrogate._decide(logits, paid, threshold, row))
        probs = model_outputs["class_probs"][0].float().numpy()
        accuracy = [float(a) for a in model_outputs["expert_accuracy"][0].float().numpy()]
        order = sorted(range(len(probs)), key=lambda k: -probs[k])[:top_k]
        output = {
            "label": DEFER_LABEL if defer else config.id2label[top],
            "defer": bool(defer),
            "expert": config.expert_names[expert] if defer else None,
            "class_label": config.id2label[top],
            "class_score": float(probs[top]),
            "expert_accuracy": accuracy,
            "expert_scores": dict(zip(config.expert_names, accuracy)),
            "scores": {config.id2label[k]: float(probs[k]) for k in order},
            **used,  # what decided: the call's costs and threshold, or the config's
        }
        if return_margin:
            output["margin"] = float(surrogate._margin(logits, paid, row)[0][0])
        return output


__all__ = ["CLASSIFIER_ANSWER", "CUSTOM_PIPELINES", "DEFER_LABEL", "REMOTE_TASK", "DeferralPipeline"]
