"""ONNX Runtime backend: a saved deferral or route-only model exported to ONNX ([`export_onnx`], `hf-defer export
--onnx`) and run by ONNX Runtime on CPUs ([`ORTModelForDeferral`]), behind the same pipeline, `hf-defer predict
--backend onnx` and `hf-defer serve --backend onnx`.

Needs the `onnx` extra (`pip install 'hf-defer[onnx]'`: `onnxruntime` and `onnx`); importing this package does not
import either, a call that needs them says which extra to install. Imports modeling and experts (a head-only router
put on its sentence encoder before export); never training, hub, commands, review or serving. Each name is imported
from its module when first read (`hf_defer._lazy`).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "ORTDeferralOutput": "modeling_ort",
    "ORTModelForDeferral": "modeling_ort",
    "decision_gap": "modeling_ort",
    "export_onnx": "export",
    "onnx_pipeline": "modeling_ort",
    "require_onnx": "export",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .export import export_onnx, require_onnx
    from .modeling_ort import ORTDeferralOutput, ORTModelForDeferral, decision_gap, onnx_pipeline
