"""Configuration of a learning-to-defer model: an encoder (or precomputed features) and a K + M head.

This module imports only ``transformers`` and the standard library: it is copied next to the weights for
remote-code loading (``trust_remote_code=True``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import field
from typing import Any, ClassVar

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

# Kept in sync by hand with ``hf_defer.surrogates.SURROGATES`` (this module cannot import it).
SURROGATE_NAMES: tuple[str, ...] = ("asm", "ssm", "sova", "aova")
POOLING_MODES: tuple[str, ...] = ("cls", "mean", "max")
EXPERT_KINDS: tuple[str, ...] = ("person", "model")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_expert_costs(costs: Any, num_experts: int, argument: str = "expert_costs") -> list[float]:
    """One finite, non-negative cost per expert, as floats (zeros when `costs` is None); anything else is refused."""
    if costs is None:
        return [0.0] * num_experts
    if hasattr(costs, "tolist"):  # np.ndarray, torch.Tensor
        costs = costs.tolist()
    if not isinstance(costs, (list, tuple)):
        raise ValueError(f"{argument} must be a list of {num_experts} numbers (one per expert), got {costs!r}.")
    if len(costs) != num_experts:
        raise ValueError(f"{argument} must have one cost per expert ({num_experts}), got {len(costs)}: {list(costs)!r}.")
    if not all(isinstance(c, numbers.Real) and not isinstance(c, bool) and math.isfinite(c) and c >= 0 for c in costs):
        raise ValueError(f"{argument} must be finite, non-negative numbers, got {list(costs)!r}.")
    return [float(cost) for cost in costs]


class DeferralConfig(PretrainedConfig):
    r"""
    Configuration of [`EncoderForDeferral`]: a model with `num_labels` (K) class outputs and `num_experts` (M)
    expert outputs that either predicts a class or defers the input to an expert.

    The features come either from a nested `encoder` (any model `AutoModel` can build: BERT, RoBERTa, ViT, ...),
    serialized inside `config.json` the way `VisionTextDualEncoderConfig` nests its sub-models, or, for a
    head-only model, from precomputed feature vectors of width `feature_size` (e.g. 384-d sentence embeddings).
    Exactly one of `encoder` and `feature_size` must be given.

    Args:
        encoder (`PretrainedConfig` or `dict`, *optional*):
            Configuration of the encoder; a `dict` must contain `model_type`.
        feature_size (`int`, *optional*):
            Width D of the precomputed feature vectors of a head-only model.
        num_labels (`int`, *optional*, defaults to 2):
            Number of classes K (at least 2). Taken from `id2label` when that is given.
        num_experts (`int`, *optional*, defaults to 1):
            Number of experts M (at least 1).
        surrogate (`str`, *optional*, defaults to `"asm"`):
            Training loss: `"asm"` (asymmetric softmax), `"ssm"`, `"sova"` or `"aova"`.
        pooling (`str`, *optional*, defaults to `"cls"`):
            How the encoder's last hidden state becomes one vector: `"cls"` (first token), or `"mean"` / `"max"`
            over the tokens that `attention_mask` keeps.
        normalize_pooled (`bool`, *optional*, defaults to `False`):
            L2-normalize the pooled vector before the head, as sentence-transformers models such as
            all-MiniLM-L6-v2 do (mean pooling + normalization reproduces their embeddings, so a head trained on
            cached sentence embeddings can be put on top of the encoder).
        head_hidden_sizes (`list[int]`, *optional*, defaults to `[]`):
            Hidden layer widths of the MLP head (ReLU between layers); empty for a linear head.
        head_dropout (`float`, *optional*, defaults to 0.0):
            Dropout probability applied before every linear layer of the head.
        freeze_encoder (`bool`, *optional*, defaults to `False`):
            Whether the encoder's weights are frozen (only the head trains).
        expert_names (`list[str]`, *optional*):
            One name per expert; defaults to `["expert_0", ..., "expert_{M-1}"]`.
        defer_threshold (`float`, *optional*, defaults to 0.0):
            Margin used by the deferral pipeline: defer when max_j (expert_accuracy_j - cost_j) exceeds the top class
            probability by more than this; set by `hf_defer.calibrate_deferral` to meet a deferral budget. The
            model's own `defer` output uses the plain logit rule.
        expert_costs (`list[float]`, *optional*):
            The price of asking each expert, in units of probability (the rule compares accuracy minus cost with
            the class probability); zeros by default. The pipeline uses them unless a call passes `expert_costs`.
        expert_kinds (`list[str]`, *optional*):
            `"person"` or `"model"` for each expert (all `"person"` by default). A model expert can answer in the
            pipeline itself (`pipeline("deferral", model=..., experts={name: predictor})`).
        kwargs (*optional*):
            Passed to [`PretrainedConfig`] (`id2label`, `label2id`, ...).

    Example:

    ```python
    >>> from transformers import BertConfig
    >>> from hf_defer import DeferralConfig
    >>> encoder = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    >>> config = DeferralConfig(encoder=encoder, num_labels=3, num_experts=2, pooling="mean")
    >>> config.num_labels, config.expert_names
    (3, ['expert_0', 'expert_1'])
    >>> head_only = DeferralConfig(feature_size=384, num_labels=3)
    >>> head_only.encoder is None
    True
    ```
    """

    model_type = "deferral"
    sub_configs_defaults = {"encoder": SubConfigSpec(config_class=AutoConfig, model_type="bert", optional=True)}
    keys_to_ignore_at_inference: ClassVar[list[str]] = [
        "class_probs",
        "expert_accuracy",
        "defer",
        "hidden_states",
        "attentions",
    ]

    encoder: PretrainedConfig | dict | None = None
    feature_size: int | None = None
    num_experts: int = 1
    surrogate: str = "asm"
    pooling: str = "cls"
    normalize_pooled: bool = False
    head_hidden_sizes: list[int] = field(default_factory=list)
    head_dropout: int | float = 0.0
    freeze_encoder: bool = False
    expert_names: list[str] | None = None
    defer_threshold: int | float = 0.0
    expert_costs: list[float] | None = None
    expert_kinds: list[str] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        has_encoder, has_features = self.encoder is not None, self.feature_size is not None
        if has_encoder == has_features:
            raise ValueError(
                "DeferralConfig needs exactly one of `encoder` (an encoder config) and `feature_size` (width of "
                f"precomputed features), got encoder={type(self.encoder).__name__} and feature_size={self.feature_size!r}."
            )
        if has_encoder and not isinstance(self.encoder, (PretrainedConfig, dict)):
            raise ValueError(f"encoder must be a PretrainedConfig or a dict, got {type(self.encoder).__name__}.")
        if isinstance(self.encoder, dict) and "model_type" not in self.encoder:
            raise ValueError(
                f"encoder given as a dict must contain 'model_type', got keys {sorted(self.encoder)[:10]}."
            )
        if has_features and not (_is_int(self.feature_size) and self.feature_size >= 1):
            raise ValueError(f"feature_size must be a positive integer, got {self.feature_size!r}.")
        num_labels = kwargs.get("num_labels")
        id2label = self.id2label
        if num_labels is not None and id2label is not None and len(id2label) != num_labels:
            raise ValueError(
                f"num_labels={num_labels!r} disagrees with id2label, which has {len(id2label)} entries."
            )
        if num_labels is not None and not (_is_int(num_labels) and num_labels >= 2):
            raise ValueError(
                f"num_labels must be an integer >= 2 (learning to defer needs at least two classes), got {num_labels!r}."
            )
        # The base class sets `_attn_implementation` on sub-configs; keep the one a loaded encoder already has.
        encoder_attn = getattr(self.encoder, "_attn_implementation", None)
        super().__post_init__(**kwargs)
        if encoder_attn is not None and "attn_implementation" not in kwargs:
            self.encoder._attn_implementation = encoder_attn
        if self.num_labels < 2:
            raise ValueError(f"num_labels must be >= 2 (learning to defer needs two classes), got {self.num_labels}.")
        if sorted(self.id2label) != list(range(self.num_labels)):
            raise ValueError(f"id2label keys must be 0..{self.num_labels - 1}, got {sorted(self.id2label)}.")
        if self.label2id is None:
            self.label2id = {label: index for index, label in self.id2label.items()}
        if not (_is_int(self.num_experts) and self.num_experts >= 1):
            raise ValueError(f"num_experts must be an integer >= 1, got {self.num_experts!r}.")
        if self.surrogate not in SURROGATE_NAMES:
            raise ValueError(f"surrogate must be one of {SURROGATE_NAMES}, got {self.surrogate!r}.")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}, got {self.pooling!r}.")
        if not isinstance(self.normalize_pooled, bool):
            raise ValueError(f"normalize_pooled must be a bool, got {self.normalize_pooled!r}.")
        sizes = self.head_hidden_sizes
        if not isinstance(sizes, (list, tuple)) or not all(_is_int(size) and size >= 1 for size in sizes):
            raise ValueError(f"head_hidden_sizes must be a list of positive integers, got {sizes!r}.")
        self.head_hidden_sizes = list(sizes)
        dropout = self.head_dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"head_dropout must be a number in [0, 1), got {dropout!r}.")
        if not isinstance(self.freeze_encoder, bool):
            raise ValueError(f"freeze_encoder must be a bool, got {self.freeze_encoder!r}.")
        if self.expert_names is None:
            self.expert_names = [f"expert_{j}" for j in range(self.num_experts)]
        names = self.expert_names
        if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
            raise ValueError(f"expert_names must be a list of strings, got {names!r}.")
        if len(names) != self.num_experts:
            raise ValueError(
                f"expert_names must name each of the num_experts={self.num_experts} experts, got {len(names)} names: "
                f"{list(names)!r}."
            )
        self.expert_names = list(names)
        threshold = self.defer_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ValueError(f"defer_threshold must be a finite number, got {threshold!r}.")
        self.expert_costs = check_expert_costs(self.expert_costs, self.num_experts)
        kinds = [EXPERT_KINDS[0]] * self.num_experts if self.expert_kinds is None else self.expert_kinds
        if not isinstance(kinds, (list, tuple)) or len(kinds) != self.num_experts or not set(kinds) <= {*EXPERT_KINDS}:
            raise ValueError(f"expert_kinds must give one of {EXPERT_KINDS} per expert ({self.num_experts}), got "
                             f"{kinds!r}.")
        self.expert_kinds = list(kinds)
        # Library mode: `import hf_defer` registers the "deferral" pipeline itself, and a custom_pipelines["deferral"]
        # entry (written for remote code) would make pipeline("deferral", ...) demand trust_remote_code=True. The
        # copy that remote code runs (module transformers_modules.*) keeps it; saving writes it back.
        if __name__.startswith("hf_defer."):
            pipelines = dict(getattr(self, "custom_pipelines", None) or {})
            if pipelines.pop("deferral", None) is not None:
                if pipelines:
                    self.custom_pipelines = pipelines
                else:
                    del self.custom_pipelines


__all__ = ["EXPERT_KINDS", "DeferralConfig", "check_expert_costs"]
