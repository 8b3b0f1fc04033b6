"""The deferral model: exactly the files `save_pretrained` copies next to the weights for `trust_remote_code` loading.

Configuration, the models (`EncoderForDeferral` and the route-only `EncoderForRouting` on their shared base class),
saving, the four surrogates (with their autograd kernels) and their base class, the routing surrogate, the pipeline
(with its option checks) and what it shares with calibration and the cascade (``availability``, ``device``,
``cascade_folder``), the guarantee record and its warnings (``guarantee_record``, ``guarantee_warnings``), and the
small argument checks that the rest of hf_defer shares too (``validators``). These
modules import only torch, transformers, the standard library and each other, relatively, and nothing else of
hf_defer: a saved folder must load without the library installed.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "SURROGATES": "surrogates",
    "DeferralConfig": "configuration_deferral",
    "DeferralGuarantee": "guarantee_record",
    "DeferralOutput": "modeling_deferral",
    "DeferralPipeline": "pipeline_deferral",
    "DeferralPreTrainedModel": "modeling_deferral",
    "DeferralSurrogate": "surrogates",
    "EncoderForDeferral": "modeling_deferral",
    "EncoderForRouting": "modeling_deferral",
    "RouteOnlySurrogate": "surrogate_routing",
    "get_surrogate": "surrogates",
    "is_route_only": "surrogate_routing",
    "side_feature_specs": "side_features",
    "surrogate_class": "surrogates",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .configuration_deferral import DeferralConfig
    from .guarantee_record import DeferralGuarantee
    from .modeling_deferral import DeferralOutput, DeferralPreTrainedModel, EncoderForDeferral, EncoderForRouting
    from .pipeline_deferral import DeferralPipeline
    from .surrogates import SURROGATES, DeferralSurrogate, get_surrogate, surrogate_class
    from .surrogate_routing import RouteOnlySurrogate, is_route_only
    from .side_features import side_feature_specs
