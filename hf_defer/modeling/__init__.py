"""The deferral model: exactly the files `save_pretrained` copies next to the weights for `trust_remote_code` loading.

Configuration, model, saving, the four surrogates (with their autograd kernels) and their base class, the route-only
surrogate, the pipeline (with its option checks) and the small argument checks that the rest of hf_defer shares too
(``validators``). These modules import only torch, transformers, the standard library and each other, relatively, and
nothing else of hf_defer: a saved folder must load without the library installed.
"""

from .configuration_deferral import DeferralConfig
from .modeling_deferral import DeferralOutput, EncoderForDeferral
from .pipeline_deferral import DeferralPipeline
from .surrogates import SURROGATES, DeferralSurrogate, get_surrogate, surrogate_class
from .side_features import side_feature_specs

__all__ = ["SURROGATES", "DeferralConfig", "DeferralOutput", "DeferralPipeline", "DeferralSurrogate",
           "EncoderForDeferral", "get_surrogate", "side_feature_specs", "surrogate_class"]
