"""The learned cascade: two saved deferral models run as one (`modeling_cascade`: [`DeferralCascade`], its saving and
loading, and stage 2's input [`escalation_features`]) and its `"deferral-cascade"` pipeline (`pipeline_cascade`:
[`DeferralCascadePipeline`], registered by `import hf_defer`). Library mode only: a cascade folder's root holds stage 1
with the single model's code files, and those know nothing of the cascade.

Imports `hf_defer.modeling` (the stages and the pipeline's option checks), `hf_defer.experts` (reading the experts'
answers), `hf_defer.evaluation` (the escalation budget) and the libraries; never data, training, hub, commands or
experiments.
"""

from .modeling_cascade import CASCADE_CONFIG_NAME, MODEL_ANSWER, DeferralCascade, escalation_features
from .pipeline_cascade import CASCADE_TASK, DeferralCascadePipeline

__all__ = ["CASCADE_CONFIG_NAME", "CASCADE_TASK", "MODEL_ANSWER", "DeferralCascade", "DeferralCascadePipeline",
           "escalation_features"]
