"""hf_defer: learning to defer (A-SM and baselines) for the Hugging Face stack.

The folders are the architecture: `modeling` (what a saved folder carries: the config, the models, the surrogates, the
pipeline), `inspection` (model, adapter and checkpoint checks), `evaluation` (metrics, costs, thresholds and their
guarantees), `data` (preparation and the shipped loaders), `experts` (simulated and model experts, embeddings),
`cascade` (two models run as one), `training`, `hub`, `commands`, `review` and `serving`; each subpackage's docstring
says what lives there and what it may import, and its `__all__` lists its public names. The experiments are not part
of the package (the repository's `research/`). This module re-exports what users call (the config, the models, the
pipeline, the trainer, the collator, data preparation, the metrics, calibration, the hub, the cascade and the shipped
loaders) and registers the model type, the auto classes and the pipeline task.
"""

from .modeling.configuration_deferral import DeferralConfig
from .modeling.modeling_deferral import DeferralOutput, EncoderForDeferral, EncoderForRouting
from .modeling.saving_deferral import DeferralSavingMixin
from .hub.auto import AutoModelForDeferral
from .training.trainer import DeferralTrainer
from .data import DataCollatorForDeferral, load_convabuse, load_hatespeech, load_imagenet16h, load_routellm_mmlu
from .data.preparation import PreparedDeferralData, prepare_deferral_dataset
from .data.annotations import aggregate_labels, annotations_to_columns
from .evaluation.metrics import DeferralMetrics, deferral_metrics
from .evaluation.evaluate_metric import load_metric
from .evaluation.thresholds import calibrate_deferral
from .evaluation.guarantees import DeferralGuarantee
from .cascade import DeferralCascade
from .hub import push_to_hub, save_for_hub
from .monitoring import DeferralMonitor

def _register_auto_classes() -> None:
    """Library mode: `AutoConfig`, `AutoModel` and `AutoModelForDeferral` load folders of model type "deferral".
    Remote-code mode: with the classes registered for auto classes (here, once), `save_pretrained` copies the code
    modules next to the weights and writes `auto_map`, so `AutoModel.from_pretrained(path, trust_remote_code=True)`
    works without hf_defer."""
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(DeferralConfig.model_type, DeferralConfig, exist_ok=True)
    # One model class per config class: EncoderForDeferral, whose loaders build an EncoderForRouting for a route-only
    # config (DeferralPreTrainedModel.class_for_config); AutoModelForDeferral asks that method first.
    AutoModel.register(DeferralConfig, EncoderForDeferral, exist_ok=True)
    AutoModelForDeferral.register(DeferralConfig, EncoderForDeferral, exist_ok=True)
    DeferralConfig.register_for_auto_class()
    EncoderForDeferral.register_for_auto_class("AutoModel")
    EncoderForRouting.register_for_auto_class("AutoModel")  # a router's folder: auto_map names EncoderForRouting


_register_auto_classes()

from .modeling.pipeline_deferral import DeferralPipeline  # noqa: E402


def _register_pipeline() -> None:
    """Library mode: `pipeline("deferral", model=...)` builds a [`DeferralPipeline`] over `AutoModelForDeferral`, and
    `pipeline("deferral-cascade", model=cascade_folder, experts=...)` a [`DeferralCascadePipeline`] (stage 1 at the
    folder's root, stage 2 and cascade_config.json read by the pipeline)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    from .cascade import CASCADE_TASK, DeferralCascadePipeline

    for task, pipeline_class in (("deferral", DeferralPipeline), (CASCADE_TASK, DeferralCascadePipeline)):
        if PIPELINE_REGISTRY.supported_tasks.get(task, {}).get("impl") is not pipeline_class:
            PIPELINE_REGISTRY.register_pipeline(task, pipeline_class=pipeline_class, pt_model=AutoModelForDeferral)
    from .experts.model_experts import answer_with_model_experts

    DeferralPipeline.model_expert_runner = staticmethod(answer_with_model_experts)  # experts= (library mode)


_register_pipeline()

# `model.push_to_hub(...)` writes the deferral card through hf_defer.push_to_hub (library mode only: the saved folder's
# code never imports hf_defer).
DeferralSavingMixin.card_pusher = staticmethod(push_to_hub)

__version__ = "0.1.0"

__all__ = [
    # the model: config, model, pipeline
    "AutoModelForDeferral",
    "DeferralConfig",
    "DeferralOutput",
    "DeferralPipeline",
    "EncoderForDeferral",
    "EncoderForRouting",
    # training and data preparation
    "DataCollatorForDeferral",
    "DeferralTrainer",
    "PreparedDeferralData",
    "aggregate_labels",
    "annotations_to_columns",
    "prepare_deferral_dataset",
    # metrics and calibration
    "DeferralGuarantee",
    "DeferralMetrics",
    "DeferralMonitor",
    "calibrate_deferral",
    "deferral_metrics",
    "load_metric",
    # the hub, the cascade, the shipped loaders
    "DeferralCascade",
    "push_to_hub",
    "save_for_hub",
    "load_convabuse",
    "load_hatespeech",
    "load_imagenet16h",
    "load_routellm_mmlu",
]
