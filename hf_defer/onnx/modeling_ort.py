"""[`ORTModelForDeferral`]: an exported deferral or route-only model run by ONNX Runtime, with the forward, the output
and the attributes the deferral pipeline reads from the PyTorch model, in the manner of `optimum`'s `ORTModel`
classes; [`onnx_pipeline`]: the deferral pipeline over it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig

from ..modeling.configuration_deferral import DeferralConfig
from ..modeling.modeling_deferral import DeferralOutput
from ..modeling.pipeline_deferral import DeferralPipeline
from ..modeling.surrogates import surrogate_for_config
from .export import ONNX_FILE, QUANTIZED_FILE, require_onnx

__all__ = ["ORTModelForDeferral", "onnx_pipeline"]

_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _onnx_file(folder: Path, file_name: str | None) -> Path:
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

    Args:
        session (`onnxruntime.InferenceSession`): the exported graph.
        config ([`DeferralConfig`]): the model's config (saved next to the graph).
        name_or_path (`str`, *optional*): where it was loaded from.
        model_path (`str`, *optional*): the ONNX file (for [`state_dict`]).

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
                 model_path: str | os.PathLike | None = None) -> None:
        self.session = session
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
                        **export_kwargs: Any) -> ORTModelForDeferral:
        """Loads an exported folder (`model.onnx` or `model_quantized.onnx`, and `config.json`).

        Args:
            model_id (`str` or `os.PathLike`): the folder [`export_onnx`] wrote; with `export=True`, a saved PyTorch
                deferral model's folder, exported first to a temporary folder.
            file_name (`str`, *optional*): the ONNX file, when the folder holds several.
            export (`bool`, *optional*, defaults to `False`): export `model_id` first (as optimum's `export=True`);
                `export_kwargs` (`quantize`, `encoder`) go to [`export_onnx`].
            provider (`str`, *optional*, defaults to `"CPUExecutionProvider"`): the ONNX Runtime execution provider.
            session_options (`onnxruntime.SessionOptions`, *optional*): the session's options.
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
        path = _onnx_file(folder, file_name)
        config = AutoConfig.from_pretrained(folder)
        if getattr(config, "model_type", None) != DeferralConfig.model_type:
            raise ValueError(f"{str(folder)!r}: config.json is not a deferral model's (model_type "
                             f"{getattr(config, 'model_type', None)!r}).")
        if session_options is None:
            session_options = onnxruntime.SessionOptions()
            session_options.intra_op_num_threads = torch.get_num_threads()
            session_options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(path), session_options, providers=[provider])
        return cls(session, config, folder, path)

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
        return f"ORTModelForDeferral({self.name_or_path!r}, inputs={self.input_names})"

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
    ) -> DeferralOutput | tuple[torch.Tensor, ...]:
        """The [`DeferralOutput`] of the PyTorch model's forward for the same inputs (see
        [`EncoderForDeferral.forward`]): logits from ONNX Runtime; the estimates, the decision and, with `labels`
        (or `expert_correct`), the loss from the surrogate."""
        feeds = self._feeds({"input_ids": input_ids, "attention_mask": attention_mask,
                             "token_type_ids": token_type_ids, "features": features,
                             "side_categorical": side_categorical, "side_numeric": side_numeric})
        logits = torch.from_numpy(self.session.run(["logits"], feeds)[0])
        loss = None
        if labels is not None or expert_correct is not None:
            loss = self.surrogate(logits, labels, expert_labels, check=check_inputs, expert_correct=expert_correct)
        class_probs = expert_accuracy = defer = None
        if output_estimates is not False:
            class_probs, expert_accuracy = self.surrogate.probabilities(logits)
            defer = self.surrogate.decide(logits, self.config.expert_costs, self.config.defer_threshold)[0]
        output = DeferralOutput(loss=loss, logits=logits, class_probs=class_probs, expert_accuracy=expert_accuracy,
                                defer=defer)
        return output if return_dict is not False else output.to_tuple()

    __call__ = forward


def onnx_pipeline(model: str | os.PathLike, **kwargs: Any) -> DeferralPipeline:
    """The deferral pipeline ([`DeferralPipeline`], what `pipeline("deferral", ...)` builds) over the ONNX export in
    the folder `model`, with the tokenizer saved there; `kwargs` go to [`ORTModelForDeferral.from_pretrained`].

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
    return DeferralPipeline(model=loaded, tokenizer=tokenizer, task="deferral", device=torch.device("cpu"))
