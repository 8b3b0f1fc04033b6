"""The deferral model: exactly the files `save_pretrained` copies next to the weights for `trust_remote_code` loading.

Configuration, the models (`EncoderForDeferral` and the route-only `EncoderForRouting` on their shared base class),
saving, the four surrogates (with their autograd kernels) and their base class, the routing surrogate, the pipeline
(with its option checks) and the small argument checks that the rest of hf_defer shares too (``validators``). These
modules import only torch, transformers, the standard library and each other, relatively, and nothing else of
hf_defer: a saved folder must load without the library installed.
"""

from .configuration_deferral import DeferralConfig
from .modeling_deferral import DeferralOutput, DeferralPreTrainedModel, EncoderForDeferral, EncoderForRouting
from .pipeline_deferral import DeferralPipeline
from .surrogates import SURROGATES, DeferralSurrogate, get_surrogate, surrogate_class
from .surrogate_routing import RouteOnlySurrogate, is_route_only
from .side_features import side_feature_specs

__all__ = ["SURROGATES", "DeferralConfig", "DeferralOutput", "DeferralPipeline", "DeferralPreTrainedModel",
           "DeferralSurrogate", "EncoderForDeferral", "EncoderForRouting", "RouteOnlySurrogate", "get_surrogate",
           "is_route_only", "side_feature_specs", "surrogate_class"]
