"""`hf-defer export --onnx [--quantize int8] MODEL OUT`: a saved deferral or route-only model as an ONNX folder
(`model.onnx` or `model_quantized.onnx`, `config.json`, the tokenizer) for `--backend onnx` ([`export_onnx`]; needs
`pip install 'hf-defer[onnx]'`)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["run_export"]


def run_export(args: argparse.Namespace) -> int:
    """`hf-defer export`: exports `args.model` to `args.output` and says where the graph went."""
    if not args.onnx:
        raise ValueError("hf-defer export writes ONNX only for now: pass --onnx (hf-defer export --onnx MODEL OUT).")
    from ..onnx import export_onnx

    path = export_onnx(args.model, args.output, quantize=args.quantize, encoder=args.encoder, overwrite=args.overwrite)
    kind = "int8 (dynamic quantization)" if args.quantize else "float32"
    print(f"wrote {path} ({kind}) with the model's config and tokenizer; run it with --backend onnx "
          f"(hf-defer predict --model {args.output} --backend onnx ...)", file=sys.stderr)
    return 0
