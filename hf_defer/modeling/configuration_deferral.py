"""Configuration of a learning-to-defer model: an encoder (or precomputed features) and a K + M head.

This module imports ``transformers``, the standard library and its siblings ``surrogates`` / ``surrogate_base`` (the
surrogate names, the check of expert costs), ``side_features`` and ``validators`` (the argument checks, and the names
the pipeline reserves: the label ``"defer"``): all are copied next to the weights for remote-code loading
(``trust_remote_code=True``). Imported as part of hf_defer, it registers the model type ``"deferral"`` with
`AutoConfig`.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .guarantee_record import DeferralGuarantee
from .library_mode import LIBRARY_MODE
from .surrogate_base import check_defer_threshold, check_expert_costs  # sibling modules: remote code copies them too
from .surrogates import SURROGATES as SURROGATE_NAMES
from .side_features import check_side_features
from .validators import CLASSIFIER_ANSWER, DEFER_LABEL, is_finite_number, is_int

POOLING_MODES: tuple[str, ...] = ("cls", "mean", "max", "last")
"""Values of `DeferralConfig.pooling`."""
EXPERT_KINDS: tuple[str, ...] = ("person", "model")
"""Values of `DeferralConfig.expert_kinds`."""


def is_decoder_only(encoder: PretrainedConfig | dict) -> bool:
    """Whether an encoder config describes a decoder-only (causal) model, whose tokens see only earlier tokens.

    The signal is the one `transformers` keeps for every architecture: a model type with a causal-LM class and no
    masked-LM class (Llama, Qwen2, Gemma, GPT-2, ...; BERT and RoBERTa have both), a config with `is_decoder=True`,
    or, for model types transformers does not know, an `architectures` entry ending in `ForCausalLM`.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    get = encoder.get if isinstance(encoder, dict) else lambda key, default=None: getattr(encoder, key, default)
    model_type = get("model_type")
    if get("is_encoder_decoder", False):
        return False
    if get("is_decoder", False):
        return True
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return any(str(name).endswith("ForCausalLM") for name in get("architectures", None) or ())


def resolve_pooling(encoder: PretrainedConfig | dict | None, pooling: str | None) -> str:
    """The pooling of a deferral model over `encoder`: checks `pooling`, or picks the default when it is `None`.

    The default follows the backbone: `"last"` (the last non-padding token) for decoder-only models, `"cls"` for
    encoders and head-only models. `"cls"` on a decoder-only model is refused: its first token attends to nothing
    after it, so the logits would not depend on the rest of the input. Encoder-decoder models (T5, BART) are refused.

    Raises:
        `ValueError`: an unknown pooling mode, `"cls"` on a decoder-only model, or an encoder-decoder model.
    """
    if pooling is not None and pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}.")
    if encoder is None:
        return pooling or "cls"
    get = encoder.get if isinstance(encoder, dict) else lambda key, default=None: getattr(encoder, key, default)
    if get("is_encoder_decoder", False):
        raise ValueError(
            f"encoder must be an encoder-only or decoder-only model, got the encoder-decoder {get('model_type')!r}: "
            "its AutoModel needs decoder inputs. Use an encoder-only model (BERT, RoBERTa, ModernBERT) or a "
            "decoder-only one (Llama, Qwen2, Gemma)."
        )
    if not is_decoder_only(encoder):
        return pooling or "cls"
    if pooling == "cls":
        raise ValueError(
            f"pooling='cls' reads the first token, but {get('model_type')!r} is decoder-only (causal attention): "
            "its first token sees no other token, so the prediction would ignore the input. Use pooling='last' "
            "(the default for decoder-only models), 'mean' or 'max'."
        )
    return pooling or "last"


class DeferralConfig(PretrainedConfig):
    r"""
    Configuration of [`EncoderForDeferral`]: a model with `num_labels` (K) class outputs and `num_experts` (M)
    expert outputs that either predicts a class or defers the input to an expert.

    The features come either from a nested `encoder` (any model `AutoModel` can build: BERT, RoBERTa, ViT, ...),
    serialized inside `config.json` the way `VisionTextDualEncoderConfig` nests its sub-models, or, for a
    head-only model, from precomputed feature vectors of width `feature_size` (e.g. 384-d sentence embeddings).
    Exactly one of `encoder` and `feature_size` must be given. Each field is checked by one `validate_*` method
    (raising `ValueError`; `TypeError` for `expert_costs` that is not a sequence), at construction and again by
    `save_pretrained`.

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
        pooling (`str`, *optional*):
            How the encoder's last hidden state becomes one vector: `"cls"` (first token), `"last"` (last token that
            `attention_mask` keeps, for left and right padding alike), or `"mean"` / `"max"` over the tokens that
            `attention_mask` keeps. Defaults to `"last"` for decoder-only encoders (Llama, Qwen2, Gemma, ...), where
            `"cls"` is refused, and to `"cls"` otherwise (see [`resolve_pooling`]).
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
            One distinct name per expert (not `"classifier"`, the pipeline's `answered_by` of the model's own
            answers); defaults to `["expert_0", ..., "expert_{M-1}"]`.
        defer_threshold (`float`, *optional*, defaults to 0.0):
            Margin used by the deferral pipeline: defer when max_j (expert_accuracy_j - cost_j) exceeds the top class
            probability by more than this; set by `hf_defer.calibrate_deferral` to meet a deferral budget. The model's
            `defer` output, the pipeline and `deferral_metrics(..., config)` all decide with it.
        expert_costs (`list[float]`, *optional*):
            The price `c_j` of asking each expert, in units of probability (the rule compares accuracy minus cost with
            the class probability); zeros by default. The pipeline uses them unless a call passes `expert_costs`;
            `calibrate_deferral(..., expert_costs=...)` stores the costs it calibrated with here.
        expert_kinds (`list[str]`, *optional*):
            `"person"` or `"model"` for each expert (all `"person"` by default). A model expert can answer in the
            pipeline itself (`pipeline("deferral", model=..., experts={name: predictor})`).
        route_only (`bool`, *optional*, defaults to `False`):
            A route-only model, an [`EncoderForRouting`] ([`RouteOnlySurrogate`]): no class head, `num_labels` = 0
            (giving classes is an error), one output per expert (at least 2), whose sigmoid estimates that expert's
            accuracy or expected score; it learns from `expert_correct` alone and routes to `argmax_j (a_j - c_j)`.
            `surrogate` is then `"route_only"`. Over feature vectors (`feature_size=D`) it is a head-only router: `forward(features,
            expert_correct=...)`.
        default_expert (`str` or `int`, *optional*):
            Route-only models: the expert that answers when no other is asked (the fixed classifier, the cheap LLM),
            by name or index, stored as its name; the first expert by default. Routing to any other expert is a
            deferral: `defer_threshold`, `calibrate_deferral`'s budget and the coverage count those. It obeys the
            pipeline's `available_experts` like the others: left out, the best available other expert answers.
        side_features (`list[dict]`, *optional*):
            Inputs beside the text or features (the subject, the prompt's length): categorical ones embedded, numeric
            ones standardised, joined to the pooled representation before the head (`hf_defer.modeling.side_features`).
        deferral_guarantee (`dict` or [`DeferralGuarantee`], *optional*):
            What `calibrate_deferral(..., confidence=...)` certified for `defer_threshold`: the claims (kind, target,
            bound, confidence), `n`, the date, the costs, experts and availability it holds for, and its assumption
            ([`DeferralGuarantee.to_dict`]; read it with [`DeferralGuarantee.from_config`]); `None` when nothing is
            certified. A calibration without a confidence clears it; the model card states it and the pipeline warns
            when a call changes what it was certified for.
        calibrated_expert_costs (`list[float]`, *optional*):
            The expert costs `defer_threshold` was calibrated at (set by `calibrate_deferral`); `None` for a threshold
            never calibrated. The pipeline warns when a call decides with other costs or another threshold.
        kwargs (*optional*):
            Passed to [`PretrainedConfig`] (`id2label`, `label2id`, ...). The class names of `id2label` must be
            distinct, and none may be `"defer"`: the pipeline's `label` of a deferred input.

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
    pooling: str | None = None
    normalize_pooled: bool = False
    head_hidden_sizes: list[int] = field(default_factory=list)
    head_dropout: int | float = 0.0
    freeze_encoder: bool = False
    expert_names: list[str] | None = None
    defer_threshold: int | float = 0.0
    expert_costs: list[int | float] | None = None
    expert_kinds: list[str] | None = None
    route_only: bool = False
    default_expert: str | int | None = None
    side_features: list[dict] | None = None
    deferral_guarantee: dict | DeferralGuarantee | None = None
    calibrated_expert_costs: list[int | float] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        if self.route_only is True:  # no class head: classes given are an error, none is 0 (not the base's 2)
            given = kwargs.get("num_labels"), self.id2label
            if given[0] not in (None, 0) or given[1]:
                raise ValueError("num_labels / id2label: a route-only model (route_only=True) has no class head and "
                                 f"cannot use class labels, got num_labels={given[0]!r}, id2label={given[1]!r}.")
            kwargs["num_labels"], self.id2label = 0, None
            self.surrogate = "route_only"
        # numpy integers (`labels.max() + 1`) are integers too: stored as int, which config.json can hold.
        for name in ("feature_size", "num_experts"):
            if is_int(getattr(self, name)):
                setattr(self, name, int(getattr(self, name)))
        if is_int(kwargs.get("num_labels")):
            kwargs["num_labels"] = int(kwargs["num_labels"])
        if isinstance(self.head_hidden_sizes, (list, tuple)):
            self.head_hidden_sizes = [int(size) if is_int(size) else size for size in self.head_hidden_sizes]
        num_labels = kwargs.get("num_labels")  # checked here: the base class would only warn
        if num_labels is not None and not (is_int(num_labels) and num_labels >= 2) and self.route_only is not True:
            raise ValueError(
                f"num_labels must be an integer >= 2 (learning to defer needs at least two classes), got {num_labels!r}."
            )
        if num_labels is not None and self.id2label is not None and len(self.id2label) != num_labels:
            raise ValueError(f"num_labels={num_labels!r} disagrees with id2label, which has {len(self.id2label)} entries.")
        self.validate_encoder()  # before the base class builds the sub-config from it
        # The base class sets `_attn_implementation` on sub-configs; keep the one a loaded encoder already has.
        encoder_attn = getattr(self.encoder, "_attn_implementation", None)
        super().__post_init__(**kwargs)
        if encoder_attn is not None and "attn_implementation" not in kwargs:
            self.encoder._attn_implementation = encoder_attn
        if self.label2id is None:
            self.label2id = {label: index for index, label in self.id2label.items()}
        self.pooling = resolve_pooling(self.encoder, self.pooling)  # None: the backbone's default
        if self.expert_names is None and is_int(self.num_experts):
            self.expert_names = [f"expert_{j}" for j in range(self.num_experts)]
        for name in ("head_hidden_sizes", "expert_names", "expert_costs", "expert_kinds"):
            if isinstance(getattr(self, name), tuple):
                setattr(self, name, list(getattr(self, name)))
        if is_int(self.num_experts) and self.expert_kinds is None:
            self.expert_kinds = [EXPERT_KINDS[0]] * self.num_experts
        if is_int(self.num_experts) and self.expert_costs is None:
            self.expert_costs = [0.0] * self.num_experts
        if self.route_only is True and isinstance(self.expert_names, list):
            if self.default_expert is None and self.expert_names:
                self.default_expert = self.expert_names[0]
            elif is_int(self.default_expert) and 0 <= self.default_expert < len(self.expert_names):
                self.default_expert = self.expert_names[self.default_expert]
        self._validate_deferral_fields()

    # One validator per field, in the `validate_*` style of `huggingface_hub.dataclasses.strict` (as transformers v5
    # configs declare theirs). They raise `ValueError` naming the field; `validate()` (run by `save_pretrained`) runs
    # them after the base class's own. The class is not decorated with `@strict`, whose wrapper errors are no
    # `ValueError`.
    def validate_encoder(self) -> None:
        has_encoder, has_features = self.encoder is not None, self.feature_size is not None
        if has_encoder == has_features:
            raise ValueError(
                "DeferralConfig needs exactly one of `encoder` (an encoder config) and `feature_size` (width of "
                f"precomputed features), got encoder={type(self.encoder).__name__} and feature_size={self.feature_size!r}."
            )
        if has_encoder and not isinstance(self.encoder, (PretrainedConfig, dict)):
            raise ValueError(f"encoder must be a PretrainedConfig or a dict, got {type(self.encoder).__name__}.")
        if isinstance(self.encoder, dict) and "model_type" not in self.encoder:
            raise ValueError(f"encoder given as a dict must contain 'model_type', got keys {sorted(self.encoder)[:10]}.")
        if has_features and not (is_int(self.feature_size) and self.feature_size >= 1):
            raise ValueError(f"feature_size must be a positive integer, got {self.feature_size!r}.")

    def validate_num_labels(self) -> None:
        if self.route_only is True:
            if self.num_labels != 0:
                raise ValueError(f"num_labels must be 0 for a route-only model (no class head), got {self.num_labels}.")
            return
        if self.num_labels < 2:
            raise ValueError(f"num_labels must be >= 2 (learning to defer needs two classes), got {self.num_labels}.")
        if sorted(self.id2label) != list(range(self.num_labels)):
            raise ValueError(f"id2label keys must be 0..{self.num_labels - 1}, got {sorted(self.id2label)}.")
        names = [self.id2label[index] for index in sorted(self.id2label)]
        repeated = sorted({str(name) for name in names if names.count(name) > 1})
        if repeated:  # label2id would keep one of them: a class name would stand for two ids
            raise ValueError(f"id2label must name each class once, got {repeated} more than once in {names}.")
        if DEFER_LABEL in names:  # the pipeline's answer for a deferred input: `label == "defer"` must mean deferred
            raise ValueError(
                f"id2label has a class named {DEFER_LABEL!r}, the label the deferral pipeline gives a deferred input; "
                f"rename the class (e.g. {DEFER_LABEL + '_class'!r}) so that the two cannot be told apart wrongly."
            )

    def validate_num_experts(self) -> None:
        if not (is_int(self.num_experts) and self.num_experts >= 1):
            raise ValueError(f"num_experts must be an integer >= 1, got {self.num_experts!r}.")

    def validate_surrogate(self) -> None:
        if self.route_only is True and self.surrogate == "route_only":
            return
        if self.surrogate not in SURROGATE_NAMES:
            raise ValueError(f"surrogate must be one of {SURROGATE_NAMES}, got {self.surrogate!r}.")

    def validate_pooling(self) -> None:
        resolve_pooling(self.encoder, self.pooling)

    def validate_side_features(self) -> None:
        if self.side_features is not None:
            self.side_features = check_side_features(self.side_features)

    def validate_route_only(self) -> None:
        if self.route_only is not True:
            if self.default_expert is not None:
                raise ValueError(f"default_expert is for route-only models (route_only=True), got "
                                 f"default_expert={self.default_expert!r} with route_only={self.route_only!r}.")
            return
        if is_int(self.num_experts) and self.num_experts < 2:
            raise ValueError(f"num_experts must be >= 2 for a route-only model (it routes between experts), got "
                             f"{self.num_experts}.")
        if self.default_expert not in (self.expert_names or []):
            raise ValueError(f"default_expert must be one of expert_names {self.expert_names!r} (or its index), got "
                             f"{self.default_expert!r}.")

    @property
    def default_expert_index(self) -> int | None:
        """The index of `default_expert` in `expert_names` (route-only models), `None` otherwise."""
        return self.expert_names.index(self.default_expert) if self.route_only is True else None

    def validate_flags(self) -> None:
        for name in ("normalize_pooled", "freeze_encoder", "route_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}.")

    def validate_head(self) -> None:
        sizes = self.head_hidden_sizes
        if not isinstance(sizes, list) or not all(is_int(size) and size >= 1 for size in sizes):
            raise ValueError(f"head_hidden_sizes must be a list of positive integers, got {sizes!r}.")
        if not (is_finite_number(self.head_dropout) and 0.0 <= self.head_dropout < 1.0):
            raise ValueError(f"head_dropout must be a number in [0, 1), got {self.head_dropout!r}.")

    def validate_expert_names(self) -> None:
        names = self.expert_names
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ValueError(f"expert_names must be a list of strings, got {names!r}.")
        if len(names) != self.num_experts:
            raise ValueError(
                f"expert_names must name each of the num_experts={self.num_experts} experts, got {len(names)} names: "
                f"{names!r}."
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:  # costs, model experts and the pipeline's `expert` are looked up by name
            raise ValueError(f"expert_names must be distinct (prices, model experts and the pipeline's answer find an "
                             f"expert by its name), got {repeated} more than once in {names!r}.")
        if CLASSIFIER_ANSWER in names:  # the pipeline's `answered_by` of an input the model answers itself
            raise ValueError(f"expert_names has an expert named {CLASSIFIER_ANSWER!r}, the pipeline's `answered_by` of "
                             "an input the model answers itself; rename the expert.")

    def validate_decision(self) -> None:
        check_defer_threshold(self.defer_threshold)
        check_expert_costs(self.expert_costs, self.num_experts)

    def validate_deferral_guarantee(self) -> None:
        """Stored in its JSON form (a dict, as ``config.json`` holds it); a [`DeferralGuarantee`] given is converted,
        a dict checked by [`DeferralGuarantee.from_dict`]."""
        if isinstance(self.deferral_guarantee, DeferralGuarantee):
            self.deferral_guarantee = self.deferral_guarantee.to_dict()
        elif self.deferral_guarantee is not None:
            DeferralGuarantee.from_dict(self.deferral_guarantee)

    def validate_expert_kinds(self) -> None:
        kinds = self.expert_kinds
        if not isinstance(kinds, list) or len(kinds) != self.num_experts or not set(kinds) <= {*EXPERT_KINDS}:
            raise ValueError(f"expert_kinds must give one of {EXPERT_KINDS} per expert ({self.num_experts}), got "
                             f"{kinds!r}.")

    def _validate_deferral_fields(self) -> None:
        for name, member in vars(DeferralConfig).items():
            if name.startswith("validate_") and callable(member):
                member(self)

    def validate(self) -> None:
        """Runs the base class's validators, then those of the deferral fields."""
        super().validate()
        self._validate_deferral_fields()


def _register() -> None:
    """Library mode: `AutoConfig` loads folders of model type ``"deferral"``, and `save_pretrained` copies the code
    modules next to the weights and writes ``auto_map`` (remote-code loading without hf_defer).

    Remote code (this file loaded from a saved folder, without hf_defer): registers the task ``"deferral"``.
    `transformers.pipeline` reads the config before it looks the task up, so ``pipeline("deferral", model=folder,
    trust_remote_code=True)`` then builds the folder's own `DeferralPipeline` over ``AutoModel`` (the folder's
    ``auto_map``), as the library does. With hf_defer imported, the library's registration stands.
    """
    if LIBRARY_MODE:
        AutoConfig.register(DeferralConfig.model_type, DeferralConfig, exist_ok=True)
        DeferralConfig.register_for_auto_class()
        return
    from transformers import AutoModel
    from transformers.pipelines import PIPELINE_REGISTRY

    from .pipeline_deferral import DeferralPipeline

    if "deferral" not in PIPELINE_REGISTRY.supported_tasks:
        PIPELINE_REGISTRY.register_pipeline("deferral", pipeline_class=DeferralPipeline, pt_model=AutoModel)


_register()

__all__ = ["EXPERT_KINDS", "DeferralConfig"]
