"""[`ORTModelForDeferral`]: an exported deferral or route-only model run by ONNX Runtime, with the forward, the output
and the attributes the deferral pipeline reads from the PyTorch model, in the manner of `optimum`'s `ORTModel`
classes; [`onnx_pipeline`]: the deferral pipeline over it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig

from ..modeling.configuration_deferral import DeferralConfig
from ..modeling.modeling_deferral import DeferralOutput
from ..modeling.pipeline_deferral import DeferralPipeline
from ..modeling.surrogate_base import check_defer_threshold, expert_gains
from ..modeling.surrogate_routing import is_route_only
from ..modeling.surrogates import surrogate_for_config
from .export import ONNX_FILE, ORT_CONFIG_FILE, QUANTIZED_FILE, require_onnx

__all__ = ["ORTDeferralOutput", "ORTModelForDeferral", "decision_gap", "onnx_pipeline"]

_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _top_two_gap(values: torch.Tensor) -> torch.Tensor:
    """The best value minus the second best, per row (`inf` where fewer than two are finite)."""
    if values.shape[1] < 2:
        return torch.full(values.shape[:1], float("inf"), dtype=values.dtype)
    top = values.topk(2, dim=1).values
    gap = top[:, 0] - top[:, 1]
    return torch.where(torch.isfinite(top[:, 1]), gap, torch.full_like(gap, float("inf")))


def decision_gap(surrogate: Any, logits: torch.Tensor, expert_costs: Any = None, defer_threshold: float = 0.0,
                 available: Any = None, route_only: bool = False) -> torch.Tensor:
    """How far each row's decision lies from changing, in units of the estimates (probabilities): the distance of the
    deferral margin from the threshold, and, for the part of the decision the row shows, the gap between the best
    and the second-best class (an answered row) or expert (a deferred row, among its candidates).

    A row's decision can change under a perturbation of the estimates only where this is at most about twice the
    perturbation; it is what the int8 export's float32 fallback compares with its tolerance.

    Args:
        surrogate ([`DeferralSurrogate`]): the model's surrogate.
        logits (`torch.Tensor` of shape `[B, K + M]`): the model's logits.
        expert_costs (sequence of `float`, *optional*): the costs the decision uses.
        defer_threshold (`float`, *optional*, defaults to 0.0): the threshold the decision uses.
        available (bool `[B, M]` or `[M]`, *optional*): who can answer each input.
        route_only (`bool`, *optional*, defaults to `False`): a route-only model's surrogate (no class head).

    Returns:
        `torch.Tensor`: float64 `[B]`, non-negative (`inf` for a decision no estimate can change).

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling import get_surrogate
    >>> from hf_defer.onnx.modeling_ort import decision_gap
    >>> aova = get_surrogate("aova", num_classes=2, num_experts=1)
    >>> logits = torch.tensor([[0.0, -9.0, 0.0]])  # class 0 and the expert both at 0.5: on the boundary
    >>> float(decision_gap(aova, logits))
    0.0

    ```
    """
    u = logits.double()
    paid = surrogate.check_costs(expert_costs)
    threshold = check_defer_threshold(defer_threshold)
    mask = surrogate.check_available(available, u.shape[0])
    margin, _ = surrogate._margin(u, paid, mask)
    gap = (margin - threshold).abs().nan_to_num(nan=float("inf"))
    defer = margin > threshold
    log_classes, log_experts = surrogate._log_estimates(u)
    gains = expert_gains(log_experts.clamp(max=700.0).exp(), paid, mask)  # the gains the margin's expert maximises
    if route_only:
        gains[:, surrogate.default_expert] = float("-inf")  # the default answers unless the margin says otherwise
    else:
        class_gap = _top_two_gap(log_classes.clamp(max=700.0).exp())
        gap = torch.where(defer, gap, torch.minimum(gap, class_gap))
    return torch.where(defer, torch.minimum(gap, _top_two_gap(gains)), gap)


@dataclass
class ORTDeferralOutput(DeferralOutput):
    """[`DeferralOutput`], and which rows an int8 export scored again in float32.

    Args:
        rescored (`torch.BoolTensor` of shape `(batch_size,)`, *optional*): `True` where the row's logits come from
            the float32 graph (its int8 decision lay within the fallback's tolerance of changing), `False` where
            from int8; `None` for a model without a fallback (every row from its one graph).

    Example (what [`ORTModelForDeferral`] returns; built by hand here):

    ```python
    >>> import torch
    >>> from hf_defer.onnx import ORTDeferralOutput
    >>> out = ORTDeferralOutput(logits=torch.zeros(2, 4), rescored=torch.tensor([True, False]))
    >>> out.rescored.tolist()  # the first row was scored again by the float32 graph
    [True, False]

    ```
    """

    rescored: torch.BoolTensor | None = None


def _read_ort_config(folder: Path) -> dict[str, Any]:
    path = folder / ORT_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{str(path)!r} is not valid JSON ({error}); re-export the model.") from None
    if not isinstance(values, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(values).__name__}; re-export the model.")
    return values


def _onnx_file(folder: Path, file_name: str | None, quantized: bool = False) -> Path:
    if file_name is None and quantized:
        file_name = QUANTIZED_FILE
    if file_name is not None:
        path = folder / file_name
        if not path.is_file():
            raise OSError(f"{str(folder)!r} has no file {file_name!r}; its ONNX files are "
                          f"{sorted(p.name for p in folder.glob('*.onnx'))}.")
        return path
    for name in (ONNX_FILE, QUANTIZED_FILE):
        if (folder / name).is_file():
            return folder / name
    found = sorted(folder.glob("*.onnx"))
    if len(found) == 1:
        return found[0]
    if found:
        raise OSError(f"{str(folder)!r} holds several ONNX files {[p.name for p in found]}: pass file_name=.")
    raise OSError(f"{str(folder)!r} has no ONNX model (model.onnx): export the saved model first, with `hf-defer "
                  f"export --onnx MODEL {folder}` (hf_defer.onnx.export_onnx), or load it with export=True.")


class ORTModelForDeferral:
    """A deferral or route-only model exported to ONNX ([`export_onnx`]) and run by ONNX Runtime.

    It returns the [`DeferralOutput`] of [`EncoderForDeferral`] / [`EncoderForRouting`]: the graph computes the logits,
    and the model's own surrogate computes the estimates and the decision from them (the same code as PyTorch's), so
    the pipeline, `hf-defer predict` and `hf-defer serve` use it as they use the PyTorch model. CPU only
    (`CPUExecutionProvider`); as many intra-op threads as PyTorch uses (`torch.get_num_threads()`, which follows
    `OMP_NUM_THREADS`) unless `session_options` say otherwise.

    An int8 export runs its int8 graph and, with a fallback (the default of `export_onnx(quantize="int8")`), scores
    again with its float32 graph the rows whose int8 [`decision_gap`] is below `fallback_tolerance`; the output's
    `rescored` says which (an empirical tolerance: see [`export_onnx`]).

    Args:
        session (`onnxruntime.InferenceSession`): the exported graph.
        config ([`DeferralConfig`]): the model's config (saved next to the graph).
        name_or_path (`str`, *optional*): where it was loaded from.
        model_path (`str`, *optional*): the ONNX file (for [`state_dict`]).
        fallback_session (`onnxruntime.InferenceSession`, *optional*): the float32 graph of an int8 export.
        fallback_tolerance (`float`, *optional*, defaults to 0.0): the decision gap below which a row is scored again
            by `fallback_session`.
        quantized (`bool`, *optional*, defaults to `False`): whether `session` is an int8 graph.

    Example:

    ```python
    >>> import tempfile, torch
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> from hf_defer.onnx import ORTModelForDeferral
    >>> folder = tempfile.mkdtemp()
    >>> EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=1)).save_pretrained(folder)
    >>> model = ORTModelForDeferral.from_pretrained(folder, export=True)  # exported on the fly (a temporary folder)
    >>> out = model(features=torch.randn(3, 4))
    >>> tuple(out.logits.shape), tuple(out.class_probs.shape), out.defer.dtype
    ((3, 3), (3, 2), torch.bool)

    ```
    """

    device = torch.device("cpu")
    dtype = torch.float32
    training = False

    def __init__(self, session: Any, config: DeferralConfig, name_or_path: str | os.PathLike | None = None,
                 model_path: str | os.PathLike | None = None, fallback_session: Any = None,
                 fallback_tolerance: float = 0.0, quantized: bool = False) -> None:
        self.session = session
        self.fallback_session = fallback_session
        self.fallback_tolerance = float(fallback_tolerance) if fallback_session is not None else 0.0
        self.quantized = quantized
        self.route_only = is_route_only(config)
        self.model_path = None if model_path is None else Path(model_path)
        self.config = config
        self.surrogate = surrogate_for_config(config)
        self.input_names = [node.name for node in session.get_inputs()]
        self.main_input_name = "features" if config.encoder is None else "input_ids"
        self.name_or_path = "" if name_or_path is None else str(name_or_path)
        self._vocab_size = getattr(config.encoder, "vocab_size", None) if config.encoder is not None else None
        specs = getattr(config, "side_features", None) or []
        self._categories = [len(spec["categories"]) for spec in specs if spec["kind"] == "categorical"]
        self._numeric = sum(spec["kind"] == "numeric" for spec in specs)

    @classmethod
    def from_pretrained(cls, model_id: str | os.PathLike, file_name: str | None = None, export: bool = False,
                        provider: str = "CPUExecutionProvider", session_options: Any = None,
                        fallback_tolerance: float | None = None, **export_kwargs: Any) -> ORTModelForDeferral:
        """Loads an exported folder (`model.onnx`, or `model_quantized.onnx` as `ort_config.json` says, and
        `config.json`).

        Args:
            model_id (`str` or `os.PathLike`): the folder [`export_onnx`] wrote; with `export=True`, a saved PyTorch
                deferral model's folder, exported first to a temporary folder.
            file_name (`str`, *optional*): the ONNX file, when the folder holds several.
            export (`bool`, *optional*, defaults to `False`): export `model_id` first (as optimum's `export=True`);
                `export_kwargs` (`quantize`, `encoder`) go to [`export_onnx`].
            provider (`str`, *optional*, defaults to `"CPUExecutionProvider"`): the ONNX Runtime execution provider.
            session_options (`onnxruntime.SessionOptions`, *optional*): the session's options.
            fallback_tolerance (`float`, *optional*): for an int8 export kept with its float32 graph, the decision gap
                below which a row is scored again in float32; defaults to the one saved in `ort_config.json`, and
                `0` runs int8 alone.
        """
        require_onnx()
        import onnxruntime

        folder = Path(model_id)
        if not folder.is_dir():
            raise OSError(f"{str(model_id)!r} is not a folder (an ONNX export of a deferral model: hf-defer export "
                          "--onnx MODEL OUT).")
        if export:
            import tempfile

            from .export import export_onnx

            source, folder = folder, Path(tempfile.mkdtemp(prefix="hf-defer-onnx-"))
            export_onnx(source, folder, overwrite=True, **export_kwargs)
        elif export_kwargs:
            raise TypeError(f"{sorted(export_kwargs)} are options of the export: pass export=True with them.")
        ort_config = _read_ort_config(folder)
        quantized = bool(ort_config.get("quantization")) and file_name in (None, QUANTIZED_FILE)
        path = _onnx_file(folder, file_name, quantized)
        saved = ort_config.get("fallback") or {}
        tolerance = saved.get("tolerance", 0.0) if quantized else 0.0
        if fallback_tolerance is not None:
            if isinstance(fallback_tolerance, bool) or not isinstance(fallback_tolerance, (int, float)) \
                    or not 0 <= fallback_tolerance < float("inf"):
                raise ValueError(f"fallback_tolerance must be a finite number >= 0 (0: int8 alone), got "
                                 f"{fallback_tolerance!r}.")
            if fallback_tolerance > 0 and not (quantized and saved):
                raise ValueError(f"fallback_tolerance={fallback_tolerance}: {str(folder)!r} has no int8 graph kept with "
                                 "its float32 one; export it with hf-defer export --onnx --quantize int8 (and no "
                                 "--fallback_tolerance 0).")
            tolerance = fallback_tolerance
        config = AutoConfig.from_pretrained(folder)
        if getattr(config, "model_type", None) != DeferralConfig.model_type:
            raise ValueError(f"{str(folder)!r}: config.json is not a deferral model's (model_type "
                             f"{getattr(config, 'model_type', None)!r}).")
        if session_options is None:
            session_options = onnxruntime.SessionOptions()
            session_options.intra_op_num_threads = torch.get_num_threads()
            session_options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(path), session_options, providers=[provider])
        fallback = None
        if tolerance > 0:
            fallback_path = folder / saved.get("file", ONNX_FILE)
            if not fallback_path.is_file():
                raise OSError(f"{str(folder)!r}: {ORT_CONFIG_FILE} names the float32 graph {fallback_path.name!r} for "
                              "the fallback, and it is missing; re-export the model.")
            fallback = onnxruntime.InferenceSession(str(fallback_path), session_options, providers=[provider])
        return cls(session, config, folder, path, fallback, tolerance, quantized)

    # what the pipeline asks of a model
    def to(self, device: Any) -> ORTModelForDeferral:
        if torch.device(device).type != "cpu":
            raise ValueError(f"ORTModelForDeferral runs on the CPU (ONNX Runtime's CPUExecutionProvider), got device "
                             f"{device!r}; use the PyTorch model (--backend torch) on an accelerator.")
        return self

    def eval(self) -> ORTModelForDeferral:
        return self

    def can_generate(self) -> bool:
        return False

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The graph's weights (its initializers) by name, as tensors: what identifies the exported model (`hf-defer
        predict` records their digest, as it does a PyTorch model's `state_dict`)."""
        if self.model_path is None:
            raise ValueError("state_dict: this ORTModelForDeferral was built without model_path (the ONNX file).")
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(str(self.model_path)).graph
        return {tensor.name: torch.from_numpy(numpy_helper.to_array(tensor).copy()) for tensor in graph.initializer}

    def __repr__(self) -> str:
        fallback = f", float32 fallback below a gap of {self.fallback_tolerance:g}" if self.fallback_session else ""
        kind = "int8" if self.quantized else "float32"
        return f"ORTModelForDeferral({self.name_or_path!r}, {kind}, inputs={self.input_names}{fallback})"

    def _feeds(self, tensors: dict[str, Any]) -> dict[str, np.ndarray]:
        """The graph's inputs as numpy arrays, checked (a `ValueError` names the input and what was expected)."""
        given = {name: value for name, value in tensors.items() if value is not None}
        if "token_type_ids" not in self.input_names:
            given.pop("token_type_ids", None)  # tokenizers add them for encoders that ignore them, as in PyTorch
        unexpected = sorted(set(given) - set(self.input_names))
        if unexpected:
            raise ValueError(f"this exported model takes {self.input_names}, got {unexpected} as well.")
        main = given.get(self.main_input_name)
        if main is None or main.dim() != 2 or main.shape[0] == 0:
            got = "None" if main is None else f"shape {tuple(main.shape)}"
            raise ValueError(f"{self.main_input_name} must be a [batch >= 1, ...] tensor, got {got}.")
        if self.main_input_name == "input_ids":
            given.setdefault("attention_mask", torch.ones_like(main))
            given.setdefault("token_type_ids", torch.zeros_like(main))
            if self._vocab_size is not None:
                low, high = (int(value) for value in torch.aminmax(main))
                if low < 0 or high >= self._vocab_size:
                    raise ValueError(f"input_ids must lie in [0, {self._vocab_size}) (the encoder's vocabulary), got "
                                     f"ids from {low} to {high}: tokenize with the model's own tokenizer.")
        elif main.shape[1] != self.config.feature_size:
            raise ValueError(f"features must have shape [batch, feature_size] = [B, {self.config.feature_size}], got "
                             f"shape {tuple(main.shape)}.")
        for name, width in (("side_categorical", len(self._categories)), ("side_numeric", self._numeric)):
            value = given.get(name)
            if width and (value is None or value.dim() != 2 or value.shape != (main.shape[0], width)):
                got = "None" if value is None else f"shape {tuple(value.shape)}"
                raise ValueError(f"{name} must have shape [batch, {width}] for this model's side features, got {got}.")
        if self._categories:
            limits = torch.tensor(self._categories)
            ids = given["side_categorical"]
            if bool(((ids < 0) | (ids > limits)).any()):
                raise ValueError("side_categorical holds a category id outside [0, number of categories].")
        missing = [name for name in self.input_names if name not in given]
        if missing:
            raise ValueError(f"this exported model needs {missing}.")
        types = {"input_ids": np.int64, "attention_mask": np.int64, "token_type_ids": np.int64,
                 "side_categorical": np.int64}
        return {name: given[name].detach().cpu().numpy().astype(types.get(name, np.float32), copy=False)
                for name in self.input_names}

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        features: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        expert_labels: torch.LongTensor | None = None,
        expert_correct: torch.FloatTensor | None = None,
        side_categorical: torch.LongTensor | None = None,
        side_numeric: torch.FloatTensor | None = None,
        return_dict: bool | None = None,
        output_estimates: bool | None = None,
        check_inputs: bool = True,
        expert_costs: Any = None,
        defer_threshold: float | None = None,
        available_experts: Any = None,
    ) -> ORTDeferralOutput | tuple[torch.Tensor, ...]:
        """The [`DeferralOutput`] of the PyTorch model's forward for the same inputs (see
        [`EncoderForDeferral.forward`]): logits from ONNX Runtime; the estimates, the decision and, with `labels`
        (or `expert_correct`), the loss from the surrogate. With a float32 fallback, `rescored` says which rows it
        scored; `expert_costs`, `defer_threshold` and `available_experts` are the decision whose boundary the
        fallback watches (the pipeline passes its call's; the config's by default), `defer` keeps the config's."""
        feeds = self._feeds({"input_ids": input_ids, "attention_mask": attention_mask,
                             "token_type_ids": token_type_ids, "features": features,
                             "side_categorical": side_categorical, "side_numeric": side_numeric})
        logits = torch.from_numpy(self.session.run(["logits"], feeds)[0])
        rescored = None
        if self.fallback_session is not None:
            costs = self.config.expert_costs if expert_costs is None else expert_costs
            threshold = self.config.defer_threshold if defer_threshold is None else defer_threshold
            rescored = decision_gap(self.surrogate, logits, costs, threshold, available_experts,
                                    self.route_only) < self.fallback_tolerance
            if bool(rescored.any()):
                logits[rescored] = torch.from_numpy(self._rescore(feeds, rescored.numpy()))
        loss = None
        if labels is not None or expert_correct is not None:
            loss = self.surrogate(logits, labels, expert_labels, check=check_inputs, expert_correct=expert_correct)
        class_probs = expert_accuracy = defer = None
        if output_estimates is not False:
            class_probs, expert_accuracy = self.surrogate.probabilities(logits)
            defer = self.surrogate.decide(logits, self.config.expert_costs, self.config.defer_threshold)[0]
        output = ORTDeferralOutput(loss=loss, logits=logits, class_probs=class_probs, expert_accuracy=expert_accuracy,
                                   defer=defer, rescored=rescored)
        return output if return_dict is not False else output.to_tuple()

    def _rescore(self, feeds: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
        """The float32 graph's logits for `rows` of the batch, the padding none of them uses cut off."""
        subset = {name: value[rows] for name, value in feeds.items()}
        mask = subset.get("attention_mask")
        if mask is not None and mask.shape[1] > 1:
            used = np.flatnonzero(mask.any(axis=0))
            length = int(used[-1]) + 1 if used.size else 1
            subset = {name: value[:, :length] if name in _TEXT_INPUTS else value for name, value in subset.items()}
        return self.fallback_session.run(["logits"], subset)[0]

    __call__ = forward


class _ORTDeferralPipeline(DeferralPipeline):
    """The deferral pipeline over an [`ORTModelForDeferral`]: the call's costs, threshold and available experts
    reach the model (the boundary its float32 fallback watches), and each output says which graph scored it
    (`scored_by`: `"int8"` or `"float32"`)."""

    def _sanitize_parameters(self, top_k: int | None | str = "", expert_costs: Any = None,
                             defer_threshold: float | None = None, return_margin: bool | None = None,
                             available_experts: Any = None, **processor_kwargs: Any) -> tuple[dict, dict, dict]:
        preprocess, forward, postprocess = super()._sanitize_parameters(
            top_k, expert_costs, defer_threshold, return_margin, available_experts, **processor_kwargs)
        decision = ("expert_costs", "defer_threshold", "available")
        return preprocess, {**forward, **{key: postprocess[key] for key in decision if key in postprocess}}, postprocess

    def _forward(self, model_inputs: dict[str, torch.Tensor], expert_costs: Any = None,
                 defer_threshold: float | None = None, available: Any = None) -> dict[str, torch.Tensor]:
        per_input = model_inputs.pop("available_experts", None)
        mask = per_input
        if available is not None:
            shared = torch.as_tensor(available)[None]
            mask = shared if per_input is None else per_input & shared
        outputs = self.model(**model_inputs, return_dict=True, expert_costs=expert_costs,
                             defer_threshold=defer_threshold, available_experts=mask)
        out = {"logits": outputs.logits, "class_probs": outputs.class_probs, "expert_accuracy": outputs.expert_accuracy}
        if outputs.rescored is not None:
            out["rescored"] = outputs.rescored
        return out if per_input is None else {**out, "available_experts": per_input.cpu()}

    def postprocess(self, model_outputs: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, Any]:
        rescored = model_outputs.pop("rescored", None)
        output = super().postprocess(model_outputs, **kwargs)
        quantized = self.model.quantized and not (rescored is not None and bool(rescored[0]))
        output["scored_by"] = "int8" if quantized else "float32"
        return output


def onnx_pipeline(model: str | os.PathLike, **kwargs: Any) -> DeferralPipeline:
    """The deferral pipeline ([`DeferralPipeline`], what `pipeline("deferral", ...)` builds) over the ONNX export in
    the folder `model`, with the tokenizer saved there; `kwargs` go to [`ORTModelForDeferral.from_pretrained`]. Each
    output says which graph scored it: **scored_by** (`"int8"` or `"float32"`; an int8 export's fallback scores the
    rows near the decision boundary in float32).

    Example:

    ```python
    >>> from hf_defer.onnx import onnx_pipeline
    >>> clf = onnx_pipeline("my-model-onnx")  # doctest: +SKIP
    >>> clf("some tweet")["label"]  # doctest: +SKIP
    'defer'
    ```
    """
    loaded = ORTModelForDeferral.from_pretrained(model, **kwargs)
    tokenizer = None
    if loaded.config.encoder is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(loaded.name_or_path)
        except (OSError, ValueError) as error:
            raise OSError(f"{str(model)!r}: the exported text model has no tokenizer there ({error}); export it "
                          "with hf-defer export, which saves the model's tokenizer.") from None
    return _ORTDeferralPipeline(model=loaded, tokenizer=tokenizer, task="deferral", device=torch.device("cpu"))
