"""The learned cascade: two saved deferral models run as one (`modeling_cascade`: [`DeferralCascade`], its saving and
loading, and stage 2's input [`escalation_features`]) and its `"deferral-cascade"` pipeline (`pipeline_cascade`:
[`DeferralCascadePipeline`], registered when that module is imported). Library mode only: a cascade folder's root holds stage 1
with the single model's code files, and those know nothing of the cascade.

Imports `hf_defer.modeling` (the stages and the pipeline's option checks), `hf_defer.experts` (reading the experts'
answers), `hf_defer.evaluation` (the escalation budget) and the libraries; never data, training, hub, commands or
experiments.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "CASCADE_CONFIG_NAME": "modeling_cascade",
    "CASCADE_TASK": "pipeline_cascade",
    "MODEL_ANSWER": "modeling_cascade",
    "DeferralCascade": "modeling_cascade",
    "DeferralCascadePipeline": "pipeline_cascade",
    "escalation_features": "modeling_cascade",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .modeling_cascade import CASCADE_CONFIG_NAME, MODEL_ANSWER, DeferralCascade, escalation_features
    from .pipeline_cascade import CASCADE_TASK, DeferralCascadePipeline
