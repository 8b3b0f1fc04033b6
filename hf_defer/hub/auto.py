"""`AutoModelForDeferral`: loads the deferral model class registered for a config, without transformers internals.

A small explicit auto class in the manner of peft's ``auto.py``: a mapping from config class to model class, and
``from_pretrained`` / ``from_config`` that look the class up in it. Importing this module registers
`DeferralConfig -> EncoderForDeferral` in it and the pipeline task ``"deferral"`` over it (after `import hf_defer`,
importing `transformers.pipelines` imports this module).
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.utils import CONFIG_NAME, find_adapter_config_file, is_peft_available

from ..modeling.configuration_deferral import DeferralConfig
from ..modeling.modeling_deferral import EncoderForDeferral
from ..modeling.pipeline_deferral import DeferralPipeline
from .model_source import resolve_model_name

_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "subfolder", "trust_remote_code")


class AutoModelForDeferral:
    """Auto class for deferral models: `AutoModelForDeferral.from_pretrained(path)` after `import hf_defer`.

    It is also the model class of the library's `"deferral"` pipeline task. This module registers
    `DeferralConfig -> EncoderForDeferral`, which builds an [`EncoderForRouting`] for a route-only config (the
    registered class's `class_for_config` chooses); [`register`] adds other pairs.

    Example:

    ```python
    >>> import tempfile
    >>> from hf_defer import AutoModelForDeferral, DeferralConfig, EncoderForDeferral
    >>> path = tempfile.mkdtemp()
    >>> EncoderForDeferral(DeferralConfig(feature_size=8, num_labels=2)).save_pretrained(path)
    >>> type(AutoModelForDeferral.from_pretrained(path)).__name__
    'EncoderForDeferral'
    >>> router = DeferralConfig(feature_size=8, route_only=True, num_experts=2)
    >>> type(AutoModelForDeferral.from_config(router)).__name__
    'EncoderForRouting'

    ```
    """

    _model_mapping: ClassVar[dict[type, type]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("AutoModelForDeferral is built with AutoModelForDeferral.from_pretrained(path) or "
                      ".from_config(config).")

    @classmethod
    def register(cls, config_class: type, model_class: type, exist_ok: bool = False) -> None:
        """Maps `config_class` to `model_class` (a `PreTrainedModel` subclass whose `config_class` is `config_class`)."""
        if not (isinstance(model_class, type) and issubclass(model_class, PreTrainedModel)):
            raise ValueError(f"model_class must be a PreTrainedModel subclass, got {model_class!r}.")
        if getattr(model_class, "config_class", None) is not config_class:
            raise ValueError(
                f"model_class.config_class must be {config_class.__name__}, got {model_class.config_class!r}."
            )
        if config_class in cls._model_mapping and cls._model_mapping[config_class] is not model_class and not exist_ok:
            raise ValueError(f"{config_class.__name__} is already mapped to {cls._model_mapping[config_class].__name__}.")
        cls._model_mapping[config_class] = model_class

    @classmethod
    def _model_class(cls, config: PretrainedConfig) -> type:
        """The registered class for `config`, or the sibling it names for this config (`class_for_config`, as
        [`EncoderForDeferral`] names [`EncoderForRouting`] for a route-only config)."""
        for config_class in type(config).__mro__:
            if config_class in cls._model_mapping:
                model_class = cls._model_mapping[config_class]
                choose = getattr(model_class, "class_for_config", None)
                return model_class if choose is None else choose(config)
        known = sorted(config_class.__name__ for config_class in cls._model_mapping)
        raise ValueError(
            f"AutoModelForDeferral has no model for {type(config).__name__} (model_type "
            f"{getattr(config, 'model_type', None)!r}); it knows {known}. Did you `import hf_defer`?"
        )

    @classmethod
    def from_config(cls, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
        """A freshly initialised model for `config`; `kwargs` go to the model class's `_from_config`."""
        return cls._model_class(config)._from_config(config, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any,
                        **kwargs: Any) -> PreTrainedModel:
        """Loads the config (unless `config=` is given), then the registered model class's `from_pretrained`.

        A folder or repository holding only a PEFT adapter (``adapter_config.json``, as `save_pretrained` of a model
        with adapters writes it) loads its base model (``base_model_name_or_path``) with the adapter on top, as
        transformers' own auto classes do. A name that is neither a folder here nor a Hub id that can be loaded fails at
        once, saying both ([`resolve_model_name`]). A folder that `hf-defer export --onnx` wrote (an ONNX graph and no
        PyTorch weights) loads as an [`~hf_defer.onnx.ORTModelForDeferral`] (the `onnx` extra), so that
        `pipeline("deferral", model=folder)` runs it with ONNX Runtime.
        """
        if not (kwargs.get("local_files_only") or kwargs.get("subfolder")):  # a missing folder is named at once
            pretrained_model_name_or_path = resolve_model_name(
                pretrained_model_name_or_path, "pretrained_model_name_or_path", token=kwargs.get("token"),
                revision=kwargs.get("revision"), cache_dir=kwargs.get("cache_dir"))
        path = os.fspath(pretrained_model_name_or_path)
        if _is_onnx_export(path):
            from ..onnx.modeling_ort import ORTModelForDeferral

            return ORTModelForDeferral.from_pretrained(path, file_name=kwargs.get("file_name"))
        config = kwargs.pop("config", None)
        config_source = pretrained_model_name_or_path
        if config is None and not os.path.isfile(os.path.join(path, CONFIG_NAME)) and is_peft_available():
            # an adapter folder: the config is the base model's; `from_pretrained` itself loads the base and the
            # adapter on top (transformers' `maybe_load_adapters`)
            hub = {key: kwargs[key] for key in ("revision", "token", "cache_dir", "local_files_only") if key in kwargs}
            adapter_config = find_adapter_config_file(path, **hub)
            if adapter_config is not None:
                with open(adapter_config, encoding="utf-8") as handle:
                    config_source = json.load(handle)["base_model_name_or_path"]
        if not isinstance(config, PretrainedConfig):
            hub = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
            config = AutoConfig.from_pretrained(config or config_source, **hub)
        model_class = cls._model_class(config)
        kwargs.pop("trust_remote_code", None)
        return model_class.from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)


def _is_onnx_export(path: str) -> bool:
    """Whether `path` is a local folder holding an ONNX export of a deferral model and no PyTorch weights."""
    if not os.path.isdir(path) or not any(name.endswith(".onnx") for name in os.listdir(path)):
        return False
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    return not any(os.path.isfile(os.path.join(path, name)) for name in weights)


def _register() -> None:
    """`AutoModelForDeferral` loads `DeferralConfig` folders, and `pipeline("deferral", model=...)` builds a
    [`DeferralPipeline`] over it."""
    from transformers.pipelines import PIPELINE_REGISTRY

    AutoModelForDeferral.register(DeferralConfig, EncoderForDeferral, exist_ok=True)
    if PIPELINE_REGISTRY.supported_tasks.get("deferral", {}).get("impl") is not DeferralPipeline:
        PIPELINE_REGISTRY.register_pipeline("deferral", pipeline_class=DeferralPipeline, pt_model=AutoModelForDeferral)


_register()

__all__ = ["AutoModelForDeferral"]
