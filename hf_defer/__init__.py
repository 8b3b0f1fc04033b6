"""hf_defer: learning to defer (A-SM and baselines) for the Hugging Face stack.

The folders are the architecture: `modeling` (what a saved folder carries: the config, the models, the surrogates, the
pipeline), `inspection` (model, adapter and checkpoint checks), `evaluation` (metrics, costs, thresholds and their
guarantees), `data` (preparation and the shipped loaders), `experts` (simulated and model experts, embeddings),
`cascade` (two models run as one), `training`, `hub`, `commands`, `review` and `serving`; each subpackage's docstring
says what lives there and what it may import, and its `__all__` lists its public names. The experiments are not part
of the package (the repository's `research/`). This module re-exports what users call (the config, the models, the
pipeline, the trainer, the collator, data preparation, the metrics, calibration, the hub, the cascade and the shipped
loaders).

Importing it is cheap: each name is imported from its module when first read (`hf_defer._lazy`), so
`import hf_defer` loads neither torch nor transformers. The model type `"deferral"` and the pipeline tasks are
registered with transformers by the modules that define them (`configuration_deferral`, `modeling_deferral`,
`hub.auto`, `cascade.pipeline_cascade`) when those are imported; after `import hf_defer`, transformers' auto classes
and `pipeline` import them when transformers' own registries are first imported ([`register_on_import`]).
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports, register_on_import

__version__ = "0.1.0"

_EXPORTS = {
    # the model: config, model, pipeline
    "AutoModelForDeferral": "hub.auto",
    "DeferralConfig": "modeling.configuration_deferral",
    "DeferralOutput": "modeling.modeling_deferral",
    "DeferralPipeline": "modeling.pipeline_deferral",
    "EncoderForDeferral": "modeling.modeling_deferral",
    "EncoderForRouting": "modeling.modeling_deferral",
    "ORTModelForDeferral": "onnx.modeling_ort",  # needs the onnx extra only when a model is loaded
    # training and data preparation
    "DataCollatorForDeferral": "data.collator",
    "DeferralTrainer": "training.trainer",
    "PreparedDeferralData": "data.preparation",
    "aggregate_labels": "data.annotations",
    "annotations_to_columns": "data.annotations",
    "prepare_deferral_dataset": "data.preparation",
    # metrics and calibration
    "DeferralGuarantee": "modeling.guarantee_record",
    "DeferralMetrics": "evaluation.metrics",
    "calibrate_deferral": "evaluation.thresholds",
    "deferral_metrics": "evaluation.metrics",
    "load_metric": "evaluation.evaluate_metric",
    "DeferralMonitor": "monitoring.monitor",
    # the hub, the cascade, the shipped loaders
    "DeferralCascade": "cascade.modeling_cascade",
    "push_to_hub": "hub.sharing",
    "save_for_hub": "hub.sharing",
    "load_convabuse": "data.convabuse",
    "load_hatespeech": "data.hatespeech",
    "load_imagenet16h": "data.imagenet16h",
    "load_routellm_mmlu": "data.routellm_mmlu",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

# transformers' registry module -> the hf_defer modules that register themselves in it when imported
register_on_import({
    "transformers.models.auto.configuration_auto": ("hf_defer.modeling.configuration_deferral",),
    "transformers.models.auto.modeling_auto": ("hf_defer.modeling.modeling_deferral",),
    "transformers.pipelines": ("hf_defer.hub.auto", "hf_defer.cascade.pipeline_cascade"),
})

if TYPE_CHECKING:
    from .cascade.modeling_cascade import DeferralCascade
    from .data.annotations import aggregate_labels, annotations_to_columns
    from .data.collator import DataCollatorForDeferral
    from .data.convabuse import load_convabuse
    from .data.hatespeech import load_hatespeech
    from .data.imagenet16h import load_imagenet16h
    from .data.preparation import PreparedDeferralData, prepare_deferral_dataset
    from .data.routellm_mmlu import load_routellm_mmlu
    from .evaluation.evaluate_metric import load_metric
    from .modeling.guarantee_record import DeferralGuarantee
    from .evaluation.metrics import DeferralMetrics, deferral_metrics
    from .evaluation.thresholds import calibrate_deferral
    from .monitoring.monitor import DeferralMonitor
    from .hub.auto import AutoModelForDeferral
    from .hub.sharing import push_to_hub, save_for_hub
    from .modeling.configuration_deferral import DeferralConfig
    from .modeling.modeling_deferral import DeferralOutput, EncoderForDeferral, EncoderForRouting
    from .modeling.pipeline_deferral import DeferralPipeline
    from .onnx.modeling_ort import ORTModelForDeferral
    from .training.trainer import DeferralTrainer
