"""Metrics of a route-only model ([`RouteOnlySurrogate`]): what routing each input to one expert achieves.

[`deferral_metrics`] hands a route-only model (or its config) here, so the Trainer's evaluation, the model card and
the CLI report these keys; the decision is the model's own, `argmax_j (a_j - c_j)` with the default expert as the
fallback ([`RouteOnlySurrogate.decide`]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .costs import mean_cost
from .reliability import reliability_bins, reliability_ece
from ..modeling.surrogate_routing import RouteOnlySurrogate

__all__ = ["route_only_metrics"]


def route_only_metrics(
    logits: Any,
    expert_correct: Any,
    surrogate: RouteOnlySurrogate,
    *,
    expert_costs: Any = None,
    defer_threshold: float = 0.0,
    n_bins: int = 15,
    budgets: Mapping[str, float] | None = None,
    budget_ranking: str = "expert_accuracy",
    return_reliability: bool = False,
    available: Any = None,
    expert_names: Sequence[str] | None = None,
    budget: Callable[[np.ndarray, np.ndarray, float], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Evaluates a route-only model from its logits ``[N, M]`` and each expert's correctness or score ``[N, M]``.

    The routes are those the pipeline takes on these inputs: any expert ``available`` allows (all when not given) may
    be chosen, whether or not its correctness is known there (nobody knows at decision time). Keys:

    * ``system_error``: ``1 -`` the mean target (correctness or score) of the chosen expert, over the rows where it is
      known; where some is missing, ``scored_share`` (the share of rows scored), ``scored_rows`` (their number) and
      ``unscored_deferrals`` (``unscored_deferrals_<name>``: inputs routed away from the default expert to an expert
      whose correctness is missing there) say what was left out.
    * ``coverage``: share of inputs the default expert answers; ``deferral_rate_<name>``: share sent to each other
      expert (the "% of strong-model calls" of RouteLLM for a pair).
    * ``expert_ece`` (mean) and ``expert_ece_<name>``: ECE of each expert's estimate over the rows it answered.
    * ``mean_cost``: the mean price paid per input, every input paying the cost of the expert it goes to (when some
      cost is not 0).
    * ``budgeted_error_{100x}``: the system error when at most ``floor(x N)`` inputs leave the default expert, kept by
      the estimated accuracy of their expert (``budget_ranking="expert_accuracy"``) or by margin (``"margin"``, what
      `calibrate_deferral` then delivers).

    [`deferral_metrics`] calls it with its own helpers: ``expert_names`` already as metric keys, ``budgets`` as a
    mapping of key to rate, and ``budget`` its [`budget_deferrals`] (required when there are budgets).

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.evaluation.metrics_routing import route_only_metrics
    >>> from hf_defer.modeling.surrogate_routing import RouteOnlySurrogate
    >>> logits = torch.logit(torch.tensor([[0.9, 0.5], [0.2, 0.7]]))  # the first stays with expert 0, the second moves
    >>> metrics = route_only_metrics(logits, [[1, 0], [0, 1]], RouteOnlySurrogate(2), budgets={})
    >>> metrics["system_error"], metrics["coverage"]
    (0.0, 0.5)

    ```
    """
    scorer = surrogate
    logits = scorer.check_logits(torch.as_tensor(np.asarray(logits, dtype=np.float32)) if not isinstance(
        logits, torch.Tensor) else logits)
    n, M, d = logits.shape[0], scorer.num_experts, scorer.default_expert
    if n == 0:
        raise ValueError("logits has no row to evaluate.")
    if isinstance(expert_correct, torch.Tensor):
        expert_correct = expert_correct.detach().cpu()
    targets = np.asarray(expert_correct)
    if targets.dtype.kind not in "biuf":
        raise ValueError(f"expert_correct must be booleans, 0/1 or scores in [0, 1] (-100 where missing), got dtype "
                         f"{targets.dtype} ({targets.ravel()[:3].tolist()}...).")
    _, correct, observed, _ = scorer.check_expert_targets(expert_correct=torch.as_tensor(targets.astype(np.float32)),
                                                          batch_size=n)
    # Who may be routed to is what the pipeline is told, never who happened to answer (nobody knows at decision time):
    # a route to an expert with no known correctness is counted apart (unscored).
    allowed = scorer.check_available(None if available is None else torch.as_tensor(np.asarray(available)), n)
    keys = list(expert_names) if expert_names is not None else [str(j) for j in range(M)]
    paid = scorer.check_costs(expert_costs)
    defer, chosen, _ = (t.numpy() for t in scorer._decide(logits, paid, defer_threshold, allowed))
    margin, expert = (t.numpy() for t in scorer._margin(logits, paid, allowed))
    accuracy = torch.sigmoid(logits.double()).numpy()
    correct, observed = correct.double().numpy(), observed.numpy()
    rows = np.arange(n)
    rank_score = margin if budget_ranking == "margin" else accuracy[rows, expert]

    def system_error(deferred: np.ndarray) -> tuple[float, float]:
        route = np.where(deferred, expert, d)
        scored = observed[rows, route]
        if not scored.any():
            return float("nan"), 0.0
        return float(1.0 - correct[rows, route][scored].mean()), float(scored.mean())

    error, share = system_error(defer)
    metrics: dict[str, Any] = {"system_error": error, "coverage": float(1.0 - defer.mean())}
    unscored = defer & ~observed[rows, expert]
    if share < 1.0:
        metrics["scored_share"] = share
    if not observed.all():  # some correctness is missing: the routes that could not be scored, and the rows that were
        metrics["unscored_deferrals"] = int(unscored.sum())
        metrics["scored_rows"] = int(round(share * n))
    soft = bool(((correct > 0) & (correct < 1)).any())
    diagrams = [reliability_bins(accuracy[observed[:, j], j], correct[observed[:, j], j], n_bins, soft=soft)
                for j in range(M)]
    eces = {j: reliability_ece(diagram) for j, diagram in enumerate(diagrams) if observed[:, j].any()}
    if eces:
        metrics["expert_ece"] = float(np.mean(list(eces.values())))
    for j, ece in eces.items():
        metrics[f"expert_ece_{keys[j]}"] = ece
    for j in range(M):
        if j != d:
            metrics[f"deferral_rate_{keys[j]}"] = float(np.mean(defer & (chosen == j)))
            if not observed.all():
                metrics[f"unscored_deferrals_{keys[j]}"] = int(np.sum(unscored & (chosen == j)))
    if paid is not None:  # every input pays the expert it goes to, the default one included
        metrics["mean_cost"] = mean_cost(np.ones(n, dtype=bool), chosen, paid.tolist())
    for key, rate in dict(budgets or {}).items():
        metrics[key] = system_error(budget(defer, rank_score, rate))[0]
    if return_reliability:
        metrics["reliability"] = diagrams
    return metrics
