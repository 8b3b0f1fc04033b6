"""`export_onnx`: a saved deferral or route-only model as an ONNX folder (`model.onnx`; with int8, also
`model_quantized.onnx` and `ort_config.json`), the model's `config.json` and its tokenizer: the layout `optimum`
exports and [`ORTModelForDeferral`] loads.

The graph computes the head's logits `[batch, num_labels + num_experts]` from the model's inputs (`input_ids`,
`attention_mask`, `token_type_ids` when the encoder takes them, or `features`; `side_categorical` / `side_numeric` for
side features), batch and sequence length dynamic. The estimates and the decision are computed from the logits by the
model's own surrogate at run time, so the ONNX model decides with the same rule as the PyTorch one.

`optimum`'s exporter (`optimum-onnx`) is not used: its newest release (0.1.0) requires `transformers<4.58`, and
hf_defer needs transformers 5. The export is `torch.onnx.export` with the TorchScript-based exporter
(`dynamo=False`: the dynamo exporter needs `onnxscript`), checked against PyTorch on two input shapes before the
folder is written. `quantize="int8"` applies ONNX Runtime's dynamic quantization (int8 weights of the linear layers,
per output channel; activations quantized on the fly), what `optimum-cli onnxruntime quantize --avx512_vnni` does for
CPUs, except for the feed-forward output projections and the head, kept in float32; and keeps the float32 graph for the
*fallback*: the rows whose int8 decision lies within `fallback_tolerance` of changing are scored again in float32.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..modeling.modeling_deferral import DeferralPreTrainedModel

__all__ = ["DEFAULT_FALLBACK_TOLERANCE", "ONNX_FILE", "ORT_CONFIG_FILE", "QUANTIZED_FILE", "export_onnx",
           "require_onnx"]

ONNX_FILE = "model.onnx"
QUANTIZED_FILE = "model_quantized.onnx"
ORT_CONFIG_FILE = "ort_config.json"  # how the folder's graphs were made and are run (optimum's name for it)
QUANTIZATIONS = ("int8",)
# The int8 decisions re-scored in float32: those whose decision gap (`decision_gap`, in units of probability) is below
# this. Measured, not derived: benchmarks/bench_onnx_agreement.py (see benchmarks/README.md, issue 46).
DEFAULT_FALLBACK_TOLERANCE = 0.05
OPSET = 17
TOLERANCE = 1e-4  # float32 logits, ONNX Runtime against PyTorch (the bar)


def require_onnx() -> None:
    """Raises an `ImportError` naming the `onnx` extra when `onnxruntime` or `onnx` is not installed.

    Example:

    ```python
    >>> from hf_defer.onnx import require_onnx
    >>> require_onnx()  # silent when `pip install 'hf-defer[onnx]'` was run

    ```
    """
    for name in ("onnxruntime", "onnx"):
        try:
            __import__(name)
        except ImportError:
            raise ImportError(f"the ONNX backend needs {name}, which is not installed: pip install 'hf-defer[onnx]' "
                              "(onnxruntime and onnx).") from None


@contextlib.contextmanager
def _quiet_root_logger() -> Any:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


class _LogitsOnly(nn.Module):
    """The model's forward on positional inputs (the graph's inputs, in order), returning the logits only."""

    def __init__(self, model: DeferralPreTrainedModel, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        inputs = dict(zip(self.names, tensors))
        return self.model(**inputs, return_dict=True, output_estimates=False, check_inputs=False).logits


def _example_inputs(model: DeferralPreTrainedModel, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Inputs of the graph for tracing and checking: token ids with one padded row (so that the traced graph keeps
    the attention mask's general path), or feature vectors; side features."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    if config.encoder is None:
        inputs = {"features": torch.randn(batch, config.feature_size, generator=generator)}
    else:
        vocab = model.input_vocab_size or 100
        ids = torch.randint(1, max(2, min(vocab, 1000)), (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        mask[-1, length // 2:] = 0
        inputs = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in model._encoder_args:
            inputs["token_type_ids"] = torch.zeros_like(ids)
    if model.side is not None:
        categories = [len(spec["categories"]) + 1 for spec in model.side.specs if spec["kind"] == "categorical"]
        if categories:
            inputs["side_categorical"] = torch.stack(
                [torch.randint(0, n, (batch,), generator=generator) for n in categories], dim=1)
        if model.side.mean:
            inputs["side_numeric"] = torch.randn(batch, len(model.side.mean), generator=generator) * 10
    return inputs


def _load(model: str | os.PathLike | DeferralPreTrainedModel, encoder: str | None) -> DeferralPreTrainedModel:
    if isinstance(model, DeferralPreTrainedModel):
        loaded = model
    else:
        if not Path(model).is_dir():
            raise OSError(f"MODEL {str(model)!r} is not a folder of a saved deferral model (save_pretrained, or "
                          "hf-defer train --output_dir).")
        loaded = DeferralPreTrainedModel.from_pretrained(model)
    if encoder is not None:
        if loaded.config.encoder is not None:
            raise ValueError(f"--encoder {encoder!r} is for a head-only model (trained on sentence embeddings); this "
                             "model has its own encoder.")
        from ..experts.embeddings import head_on_sentence_encoder

        loaded = head_on_sentence_encoder(loaded, encoder)
    if loaded.config.encoder is not None and loaded.main_input_name != "input_ids":
        raise ValueError(f"export_onnx exports text-encoder and head-only deferral models; this one reads "
                         f"{loaded.main_input_name} (a vision encoder), which is not supported yet.")
    return loaded.eval()


def _export(model: DeferralPreTrainedModel, path: Path) -> list[str]:
    """`torch.onnx.export` of the logits, dynamic batch and sequence axes; returns the graph's input names."""
    inputs = _example_inputs(model, batch=2, length=8, seed=0)
    names = list(inputs)
    dynamic = {name: ({0: "batch_size", 1: "sequence_length"} if name in ("input_ids", "attention_mask",
                                                                          "token_type_ids") else {0: "batch_size"})
               for name in names}
    dynamic["logits"] = {0: "batch_size"}
    options: dict[str, Any] = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False
    wrapper = _LogitsOnly(model, names).eval()  # a fresh module trains: the exporter would restore that on `model`
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's warnings about Python branches on shapes, the deprecation note
        torch.onnx.export(wrapper, tuple(inputs.values()), str(path), input_names=names, output_names=["logits"],
                          dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=True, **options)
    return names


def _session(path: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _check_against_torch(model: DeferralPreTrainedModel, path: Path) -> float:
    """The largest |logit difference| between ONNX Runtime and PyTorch on two input shapes other than the traced
    one; a `RuntimeError` above the tolerance (a shape the tracer fixed, an op exported wrongly)."""
    session = _session(path)
    worst = 0.0
    for batch, length, seed in ((3, 5, 1), (1, 13, 2)):
        inputs = _example_inputs(model, batch, length, seed)
        with torch.no_grad():
            expected = model(**inputs, return_dict=True, output_estimates=False).logits.float().numpy()
        got = session.run(["logits"], {name: value.numpy() for name, value in inputs.items()})[0]
        if got.shape != expected.shape:
            raise RuntimeError(f"the exported graph gave logits of shape {got.shape} for inputs of batch {batch}, "
                               f"expected {expected.shape}.")
        worst = max(worst, float(abs(got - expected).max()))
    if not worst <= TOLERANCE * max(1.0, float(abs(expected).max())):
        raise RuntimeError(f"the exported graph's logits differ from PyTorch's by {worst:.3g} (more than "
                           f"{TOLERANCE:g}); the model has an operation that torch.onnx.export cannot trace faithfully.")
    return worst


def _is_ffn_output(name: str) -> bool:
    """Whether a MatMul node is an encoder's feed-forward output projection (after the GELU): `output.dense` of
    BERT-style encoders (BERT, MiniLM, RoBERTa, ELECTRA), `ffn.lin2` of DistilBERT."""
    return ("/output/dense/" in name and "/attention/" not in name) or "/ffn/lin2/" in name


def _quantize_int8(source: Path, target: Path) -> dict[str, Any]:
    """ONNX Runtime's dynamic int8 quantization of `source` into `target`; returns its settings (for
    `ort_config.json`). int8 weights per output channel on the encoder's matrix products with a weight, except the
    feed-forward output projections (whose inputs, after the GELU, have the widest range: quantized per tensor they
    moved the most decisions; kept in float32 they cost a quarter of int8's speed, and int8 alone changes 30-45 % fewer
    decisions, so the fallback re-scores in float32 fewer that it must); the attention scores, the embeddings, the
    head and the side features stay float32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source)).graph
    weights = {tensor.name for tensor in graph.initializer}
    # the quantizer turns each Gemm (a linear layer on [batch, features]: the head's) into a MatMul named so
    matmuls = [node.name + ("_MatMul" if node.op_type == "Gemm" else "") for node in graph.node
               if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights]
    excluded = [name for name in matmuls if "/encoder/" not in name or _is_ffn_output(name)]
    with _quiet_root_logger():  # its advice to pre-process the graph is for static quantization
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], nodes_to_exclude=excluded)
    return {"method": "onnxruntime.quantization.quantize_dynamic", "weight_type": "QInt8", "per_channel": True,
            "op_types_to_quantize": ["MatMul"], "nodes_to_exclude": excluded,
            "quantized": len(matmuls) - len(excluded)}


def _check_tolerance(fallback_tolerance: Any, quantize: str | None) -> float:
    if fallback_tolerance is None:
        return DEFAULT_FALLBACK_TOLERANCE if quantize else 0.0
    if quantize is None:
        raise ValueError("--fallback_tolerance is for an int8 export (--quantize int8): a float32 export decides as "
                         "PyTorch already.")
    if isinstance(fallback_tolerance, bool) or not isinstance(fallback_tolerance, (int, float)) \
            or not 0 <= fallback_tolerance < float("inf"):
        raise ValueError(f"--fallback_tolerance must be a finite number >= 0 (0: no float32 fallback), got "
                         f"{fallback_tolerance!r}.")
    return float(fallback_tolerance)


def _save_config(config: Any, output: Path) -> None:
    """`config.json` alone: not the remote code that `save_pretrained` copies for a PyTorch folder (an exported folder
    loads in library mode, `import hf_defer`), nor the `auto_map` that would point at it."""
    values = config.to_diff_dict()
    for key in ("auto_map", "custom_pipelines"):
        values.pop(key, None)
    (output / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def _save_processor(source: Any, output: Path) -> None:
    """The tokenizer saved with the source model (or the sentence encoder's), when there is one."""
    if source is None:
        return
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError):
        return
    tokenizer.save_pretrained(output)


def export_onnx(model: str | os.PathLike | DeferralPreTrainedModel, output_dir: str | os.PathLike,
                quantize: str | None = None, encoder: str | None = None, overwrite: bool = False,
                fallback_tolerance: float | None = None) -> Path:
    """Exports a saved deferral or route-only model to an ONNX folder that [`ORTModelForDeferral.from_pretrained`],
    `hf-defer predict --backend onnx` and `hf-defer serve --backend onnx` load.

    The folder holds `model.onnx` (float32), the model's `config.json` and its tokenizer. The export is checked: ONNX
    Runtime's logits must match PyTorch's within 1e-4 on input shapes other than the traced one, or nothing is
    written. The float32 export decides as PyTorch does.

    With `quantize="int8"` it holds `model_quantized.onnx` too (dynamic int8 quantization), which the folder's users
    run, and `ort_config.json` (the quantization's settings and the fallback's tolerance). int8 alone changed 2.9 % of
    the HateSpeech decisions and 1.7 % of the MMLU routes of a MiniLM model (those near the deferral threshold or
    between two close classes), so by default the rows whose int8 *decision gap* ([`decision_gap`]: the distance, in
    probability, from the threshold and between the two best classes or experts) is below `fallback_tolerance` are
    scored again with the float32 graph; the output says which rows were (`rescored`, the pipeline's `scored_by`).
    With the default tolerance no decision of the 4,957 HateSpeech test tweets and 1,000 MMLU prompts changed, while
    52 % and 27 % of them were re-scored (benchmarks/README.md): a tolerance measured on those data, **not a
    guarantee** for other models or inputs. The fallback costs what the share of inputs near the boundary costs in
    float32: use int8 where few lie there (a router), float32 where decisions must not move and many do, and
    `fallback_tolerance=0` (int8 alone) where throughput matters more than a few % of the decisions.

    Args:
        model (`str`, `os.PathLike` or [`DeferralPreTrainedModel`]): a saved model's folder, or the model.
        output_dir (`str` or `os.PathLike`): the folder to write; refused when it exists and is not empty, unless
            `overwrite`.
        quantize (`str`, *optional*): `"int8"`: dynamic int8 quantization (ONNX Runtime's `quantize_dynamic`).
        encoder (`str`, *optional*): for a head-only model trained on sentence embeddings, the sentence encoder to
            put it on first ([`head_on_sentence_encoder`]), so that the exported model reads text.
        overwrite (`bool`, *optional*, defaults to `False`): replace the files of an existing `output_dir`.
        fallback_tolerance (`float`, *optional*): with `quantize="int8"`, the decision gap below which a row is
            scored again in float32; defaults to `DEFAULT_FALLBACK_TOLERANCE` (0.05), and `0` keeps the int8 graph
            alone (every decision from int8; no `model.onnx`).

    Returns:
        `Path`: the ONNX file the folder's users run (`model_quantized.onnx` with int8).

    Example:

    ```python
    >>> import tempfile, torch
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> from hf_defer.onnx import ORTModelForDeferral, export_onnx
    >>> model = EncoderForDeferral(DeferralConfig(feature_size=8, num_labels=3, num_experts=1)).eval()
    >>> folder = tempfile.mkdtemp()
    >>> export_onnx(model, folder, overwrite=True).name
    'model.onnx'
    >>> features = torch.randn(4, 8)
    >>> ort = ORTModelForDeferral.from_pretrained(folder)
    >>> bool(torch.allclose(ort(features=features).logits, model(features=features).logits, atol=1e-5))
    True

    ```
    """
    require_onnx()
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"--quantize must be one of {list(QUANTIZATIONS)}, got {quantize!r}.")
    tolerance = _check_tolerance(fallback_tolerance, quantize)
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or (any(output.iterdir()) and not overwrite)):
        raise FileExistsError(f"OUT {str(output)!r} exists{' and is not empty' if output.is_dir() else ''}; choose "
                              "another folder or pass --overwrite.")
    loaded = _load(model, encoder)
    with tempfile.TemporaryDirectory() as scratch:
        exported = Path(scratch) / ONNX_FILE
        _export(loaded, exported)
        _check_against_torch(loaded, exported)
        settings = None
        if quantize == "int8":
            settings = _quantize_int8(exported, Path(scratch) / QUANTIZED_FILE)
        output.mkdir(parents=True, exist_ok=True)
        for name in (ONNX_FILE, QUANTIZED_FILE, ORT_CONFIG_FILE):  # a re-export replaces the other kind's files too
            (output / name).unlink(missing_ok=True)
        target = output / ONNX_FILE
        if settings is not None:
            target = output / QUANTIZED_FILE
            shutil.move(str(Path(scratch) / QUANTIZED_FILE), target)
            ort_config = {"quantization": {"format": quantize, **settings},
                          "fallback": {"file": ONNX_FILE, "tolerance": tolerance} if tolerance > 0 else None}
            (output / ORT_CONFIG_FILE).write_text(json.dumps(ort_config, indent=2) + "\n")
        if settings is None or tolerance > 0:
            shutil.move(str(exported), output / ONNX_FILE)
    _save_config(loaded.config, output)
    source = encoder or (getattr(model, "name_or_path", None) if isinstance(model, DeferralPreTrainedModel) else model)
    if loaded.config.encoder is not None:
        _save_processor(source, output)
    return target
