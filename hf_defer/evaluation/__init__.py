"""Evaluating a deferral model: metrics (system error, coverage, expert ECE, budgeted errors), reliability, costs and
error-cost curves, calibration of the deferral budget (with a stated confidence: `guarantees`), RouteLLM's measures
of a router (`routellm_metrics`: APGR, CPT), plotting and the `evaluate` module. The baselines of our experiments
(confidence cascade, threshold router) are in `research/routing_baselines.py`, outside the package.

Imports `hf_defer.modeling` and the libraries; never data, experts, training, hub or anything above them.
"""
