"""ONNX Runtime backend: a saved deferral or route-only model exported to ONNX ([`export_onnx`], `hf-defer export
--onnx`) and run by ONNX Runtime on CPUs ([`ORTModelForDeferral`]), behind the same pipeline, `hf-defer predict
--backend onnx` and `hf-defer serve --backend onnx`.

Needs the `onnx` extra (`pip install 'hf-defer[onnx]'`: `onnxruntime` and `onnx`); importing this package does not
import either, a call that needs them says which extra to install. Imports modeling and experts (a head-only router
put on its sentence encoder before export); never training, hub, commands, review or serving.
"""

from .export import export_onnx, require_onnx
from .modeling_ort import ORTModelForDeferral, onnx_pipeline

__all__ = ["ORTModelForDeferral", "export_onnx", "onnx_pipeline", "require_onnx"]
