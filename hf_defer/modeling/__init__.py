"""The deferral model: exactly the files `save_pretrained` copies next to the weights for `trust_remote_code` loading.

Configuration, the models (`EncoderForDeferral` and the route-only `EncoderForRouting` on their shared base class),
saving, the four surrogates (with their base class and autograd kernels), the routing surrogate and the pipeline (with
its option checks). These modules import only torch, transformers, the standard library and each other, relatively,
and nothing else of hf_defer: a saved folder must load without the library installed.
"""

from .configuration_deferral import DeferralConfig
from .modeling_deferral import DeferralOutput, DeferralPreTrainedModel, EncoderForDeferral, EncoderForRouting
from .surrogate_routing import RouteOnlySurrogate, is_route_only

__all__ = ["DeferralConfig", "DeferralOutput", "DeferralPreTrainedModel", "EncoderForDeferral", "EncoderForRouting",
           "RouteOnlySurrogate", "is_route_only"]
