"""Evaluating a deferral model: metrics (system error, coverage, expert ECE, budgeted errors), reliability, costs and
error-cost curves, the deferral threshold set from held-out data (`thresholds`; with a stated confidence:
`guarantees`), RouteLLM's measures of a router (`routellm_metrics`: APGR, CPT), plotting and the `evaluate` module.
The baselines of our experiments (confidence cascade, threshold router) are in `research/routing_baselines.py`,
outside the package.

Imports `hf_defer.modeling` and the libraries; never data, experts, training, hub or anything above them.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "DeferralGuarantee": "guarantees",
    "DeferralMetrics": "metrics",
    "ErrorCostCurve": "costs",
    "area_under_error_cost": "costs",
    "budget_threshold": "guarantees",
    "calibrate_deferral": "thresholds",
    "certify_threshold": "guarantees",
    "deferral_metrics": "metrics",
    "error_cost_curve": "costs",
    "error_threshold": "guarantees",
    "expected_calibration_error": "reliability",
    "load_metric": "evaluate_metric",
    "mean_cost": "costs",
    "pareto_front": "costs",
    "plot_estimate_histograms": "plotting",
    "plot_pooled_reliability": "plotting",
    "plot_reliability_diagram": "plotting",
    "pool_reliability": "reliability",
    "reliability_bins": "reliability",
    "reliability_ece": "reliability",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .metrics import DeferralMetrics, deferral_metrics
    from .reliability import expected_calibration_error, pool_reliability, reliability_bins, reliability_ece
    from .costs import ErrorCostCurve, area_under_error_cost, error_cost_curve, mean_cost, pareto_front
    from .thresholds import calibrate_deferral
    from .guarantees import DeferralGuarantee, budget_threshold, certify_threshold, error_threshold
    from .evaluate_metric import load_metric
    from .plotting import plot_estimate_histograms, plot_pooled_reliability, plot_reliability_diagram
