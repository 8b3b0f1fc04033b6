"""Evaluating a deferral model: metrics (system error, coverage, expert ECE, budgeted errors), reliability, costs and
error-cost curves, the deferral threshold set from held-out data (`thresholds`; with a stated confidence:
`guarantees`), the routing baselines,
plotting and the `evaluate` module.

Imports `hf_defer.modeling` and the libraries; never data, experts, training, hub or anything above them.
"""
