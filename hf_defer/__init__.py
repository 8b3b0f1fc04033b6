"""hf_defer: learning to defer (A-SM and baselines) for the Hugging Face stack.

The folders are the architecture: `modeling` (what a saved folder carries), `evaluation`, `data`, `experts`,
`training`, `hub`, `commands`, `review` and `serving`; each subpackage's docstring says what lives there and what it may
import. The experiments are not part of the package (the repository's `research/`). This module re-exports the public API and registers the model type, the auto classes and the pipeline task.
"""

from .evaluation.metrics import DeferralMetrics, deferral_metrics, expected_calibration_error, reliability_bins
from .modeling.surrogates import SURROGATES, DeferralSurrogate, get_surrogate
from .modeling.configuration_deferral import DeferralConfig
from .modeling.modeling_deferral import DeferralOutput, EncoderForDeferral
from .modeling.saving_deferral import DeferralSavingMixin
from .hub.auto import AutoModelForDeferral
from .training.trainer import DeferralTrainer
from .data import DataCollatorForDeferral, load_hatespeech
from .data.preparation import PreparedDeferralData, prepare_deferral_dataset
from .data.annotations import aggregate_labels, annotations_to_columns
from .experts.embeddings import add_embeddings, embed_texts
from .experts import annotator_expert, class_subset_expert, model_expert, stack_experts
from .experts.deferral_cascade import DeferralCascade
from .evaluation.costs import ErrorCostCurve, error_cost_curve, mean_cost
from .evaluation.calibration import calibrate_deferral
from .evaluation.guarantees import DeferralGuarantee, budget_threshold, certify_threshold, error_threshold
from .evaluation.evaluate_metric import load_metric
from .hub import push_to_hub, save_for_hub
from .hub.model_card import DeferralModelCardData, render_model_card

def _register_auto_classes() -> None:
    """Library mode: `AutoConfig`, `AutoModel` and `AutoModelForDeferral` load folders of model type "deferral".
    Remote-code mode: with the classes registered for auto classes (here, once), `save_pretrained` copies the code
    modules next to the weights and writes `auto_map`, so `AutoModel.from_pretrained(path, trust_remote_code=True)`
    works without hf_defer."""
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(DeferralConfig.model_type, DeferralConfig, exist_ok=True)
    AutoModel.register(DeferralConfig, EncoderForDeferral, exist_ok=True)
    AutoModelForDeferral.register(DeferralConfig, EncoderForDeferral, exist_ok=True)
    DeferralConfig.register_for_auto_class()
    EncoderForDeferral.register_for_auto_class("AutoModel")


_register_auto_classes()

from .modeling.pipeline_deferral import DeferralPipeline  # noqa: E402


def _register_pipeline() -> None:
    """Library mode: `pipeline("deferral", model=...)` builds a [`DeferralPipeline`] over `AutoModelForDeferral`, and
    `pipeline("deferral-cascade", model=cascade_folder, experts=...)` a [`DeferralCascadePipeline`] (stage 1 at the
    folder's root, stage 2 and cascade_config.json read by the pipeline)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    from .experts.cascade_pipeline import CASCADE_TASK, DeferralCascadePipeline

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
    "SURROGATES",
    "AutoModelForDeferral",
    "DeferralCascade",
    "DeferralConfig",
    "DeferralOutput",
    "DeferralPipeline",
    "EncoderForDeferral",
    "DeferralMetrics",
    "DeferralSurrogate",
    "DeferralTrainer",
    "DataCollatorForDeferral",
    "DeferralModelCardData",
    "PreparedDeferralData",
    "ErrorCostCurve",
    "calibrate_deferral",
    "DeferralGuarantee",
    "budget_threshold",
    "certify_threshold",
    "error_threshold",
    "push_to_hub",
    "render_model_card",
    "save_for_hub",
    "add_embeddings",
    "aggregate_labels",
    "annotations_to_columns",
    "annotator_expert",
    "class_subset_expert",
    "deferral_metrics",
    "embed_texts",
    "error_cost_curve",
    "load_hatespeech",
    "prepare_deferral_dataset",
    "mean_cost",
    "model_expert",
    "stack_experts",
    "expected_calibration_error",
    "get_surrogate",
    "load_metric",
    "reliability_bins",
]
