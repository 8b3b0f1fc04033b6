"""`hf-defer export --onnx [--quantize int8 [--fallback_tolerance T]] MODEL OUT`: a saved deferral or route-only
model as an ONNX folder (`model.onnx`; with int8 also `model_quantized.onnx` and `ort_config.json`; `config.json`, the
tokenizer) for `--backend onnx` ([`export_onnx`]; needs `pip install 'hf-defer[onnx]'`)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["run_export"]


def run_export(args: argparse.Namespace) -> int:
    """`hf-defer export`: exports `args.model` to `args.output` and says where the graph went."""
    if not args.onnx:
        raise ValueError("hf-defer export writes ONNX only for now: pass --onnx (hf-defer export --onnx MODEL OUT).")
    from ..onnx import export_onnx

    tolerance = getattr(args, "fallback_tolerance", None)
    path = export_onnx(args.model, args.output, quantize=args.quantize, encoder=args.encoder, overwrite=args.overwrite,
                       fallback_tolerance=tolerance)
    kind = "float32"
    if args.quantize:
        kind = "int8 (dynamic quantization), int8 alone" if tolerance == 0 else \
            "int8 (dynamic quantization), with model.onnx re-scoring the inputs near the decision boundary"
    print(f"wrote {path} ({kind}) with the model's config and tokenizer; run it with --backend onnx "
          f"(hf-defer predict --model {args.output} --backend onnx ...)", file=sys.stderr)
    return 0
