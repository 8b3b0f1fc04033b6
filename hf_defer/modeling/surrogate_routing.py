"""The surrogate of route-only models ([`EncoderForRouting`]): no class head, one calibrated accuracy (or score)
estimate per expert, and the cost rule; with the pipeline's answer for such a model and [`is_route_only`].

A route-only model scores ``M`` experts only (a fixed classifier, a small LLM, a large LLM, a person): its logits have
shape ``[B, M]`` and ``a_j(x) = sigmoid(u_j)`` estimates expert ``j``'s accuracy, or its expected score. It routes each
input to ``argmax_j (a_j - c_j)``. One expert is the *default* (the analogue of "the model answers" of a deferral
model: the fixed classifier, or the cheap LLM); routing anywhere else is a *deferral*, so the deferral budget of
``calibrate_deferral`` caps the share of calls to the other (costly) experts, RouteLLM's "% of strong-model calls".

This module only imports ``torch`` and its sibling ``surrogate_base``: it is copied next to the model code for
remote-code loading.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import torch
import torch.nn.functional as F

from .surrogate_base import IGNORE_INDEX, DeferralSurrogate, as_target_tensor, check_defer_threshold

__all__ = ["RouteOnlySurrogate", "is_route_only", "route_only_output"]


class RouteOnlySurrogate(DeferralSurrogate):
    r"""Per-expert binary log loss with soft targets and missing-answer masks, for route-only models (no class head).

    Loss, per row: ``sum_j o_j [-c_j log sigmoid(u_j) - (1 - c_j) log(1 - sigmoid(u_j))]`` with ``c_j`` in [0, 1]
    (was expert ``j`` right, or its score) and ``o_j`` whether it answered; computed as
    ``F.binary_cross_entropy_with_logits(u, c, weight=o)`` (stable for any finite logit, in any precision).

    Why ``sigmoid(u_j)`` estimates ``E[c_j | x, o_j = 1]``: the binary log loss is a *strictly proper* scoring rule. For
    a target ``c`` in [0, 1] with conditional mean ``q = E[c | x, o_j = 1]``, the conditional risk of predicting ``a`` is
    ``E[-c log a - (1 - c) log(1 - a)] = -q log a - (1 - q) log(1 - a)`` (linear in ``c``), whose derivative
    ``(a - q) / (a (1 - a))`` vanishes only at ``a = q``: the unique minimiser. Expert ``j``'s term involves ``u_j``
    alone and is multiplied by ``Pr(o_j = 1 | x)``, so each output is minimised at its own target wherever the expert
    answers with positive probability, whatever the other experts do. With answers missing at random that is
    ``Pr(expert j is right | x)`` (``E[score | x]``); otherwise it is the accuracy on the inputs the expert chose.

    Decision: with costs ``c_j`` and the default expert ``d``, route to ``argmax_j (a_j - c_j)``: the input is
    *deferred* (sent away from ``d``) iff ``max_{j != d, available} (a_j - c_j) - (a_d - c_d) > defer_threshold``, to
    ``argmax_{j != d, available} (a_j - c_j)``; otherwise ``d`` answers. With zero costs and threshold this is exactly
    ``max_{j != d} u_j > u_d`` (the sigmoid is increasing). ``available`` binds the default expert too: where it
    excludes ``d`` and allows another expert, the input goes to the best available other one whatever the threshold
    (its margin is ``+inf``); where it allows nobody, ``d`` is the fallback (margin ``-inf``, not deferred), which the
    deferral pipeline refuses rather than route to an excluded expert.

    Args:
        num_experts (`int`): number of experts ``M`` (at least 2: routing needs a choice).
        default_expert (`int`, *optional*, defaults to 0): index of the default expert ``d``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling.surrogate_routing import RouteOnlySurrogate
    >>> router = RouteOnlySurrogate(num_experts=2, default_expert=0)  # 0: the cheap model, 1: the strong one
    >>> logits = torch.logit(torch.tensor([[0.6, 0.9], [0.8, 0.85]]))
    >>> defer, chosen, _ = router.decide(logits, expert_costs=[0.0, 0.1])  # gains 0.6 vs 0.8; 0.8 vs 0.75
    >>> defer.tolist(), chosen.tolist()
    ([True, False], [1, 0])
    >>> loss = router(logits, expert_correct=torch.tensor([[1.0, 1.0], [0.0, -100.0]]))

    ```
    """

    name = "route_only"
    display_name = "Route-only"
    description = "per-expert binary log loss on each expert's correctness or score (no class head)"
    citation = "two-stage learning to defer, Narasimhan et al., NeurIPS 2022; Mao et al., NeurIPS 2023"
    bounded = True

    def __init__(self, num_experts: int, default_expert: int = 0) -> None:
        if isinstance(num_experts, bool) or not isinstance(num_experts, Integral) or num_experts < 2:
            raise ValueError(f"num_experts must be an integer >= 2 for a route-only model (it routes between experts), "
                             f"got {num_experts!r}.")
        if isinstance(default_expert, bool) or not isinstance(default_expert, Integral) or not 0 <= default_expert < num_experts:
            raise ValueError(f"default_expert must be an expert index in [0, {num_experts}), got {default_expert!r}.")
        self.num_classes = 0
        self.num_experts = int(num_experts)
        self.default_expert = int(default_expert)

    def __repr__(self) -> str:
        return f"RouteOnlySurrogate(num_experts={self.num_experts}, default_expert={self.default_expert})"

    # ------------------------------------------------------------------ targets
    def check_expert_targets(self, labels: Any = None, expert_labels: Any = None, batch_size: int | None = None,
                             device: torch.device | None = None, check_values: bool = True, *,
                             expert_correct: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The targets of a route-only model: ``expert_correct`` only (``[B, M]`` bools, 0/1 or scores in [0, 1];
        ``-100`` where an expert did not answer). Class labels and the experts' answers are refused: without a class
        head there is nothing to score them against.

        Returns:
            `tuple`: zeros (long ``[B]``, no classes), ``correct`` (float32 ``[B, M]``, 0 where not answered),
            ``observed`` (bool ``[B, M]``) and ``valid`` (bool ``[B]``, all `True`).
        """
        if labels is not None and not _all_ignored(labels):
            raise ValueError("labels: a route-only model has no class head and cannot use class labels; give each "
                             "expert's correctness or score as expert_correct instead, got labels.")
        if expert_labels is not None:
            raise ValueError("expert_labels: a route-only model learns from each expert's correctness or score "
                             "(expert_correct), not from its answers (class ids), which need a class label to score.")
        if expert_correct is None:
            raise ValueError("expert_correct is required by a route-only model: [batch, num_experts] booleans, 0/1 or "
                             f"scores in [0, 1] ({IGNORE_INDEX} where an expert did not answer), got None.")
        scores = as_target_tensor("expert_correct", expert_correct, device)
        if batch_size is None:
            batch_size = scores.shape[0] if scores.dim() else 0
        if scores.is_complex():
            raise ValueError(f"expert_correct must be real numbers in [0, 1], got dtype {scores.dtype}.")
        scores = self._expert_shape("expert_correct", scores, batch_size).float()
        observed = scores != IGNORE_INDEX
        if check_values:
            bad = observed & ~((scores >= 0) & (scores <= 1))  # NaN too
            if bad.any():
                raise ValueError(f"expert_correct must lie in [0, 1] (1: right, 0: wrong, or a score) or be "
                                 f"{IGNORE_INDEX} (no answer), got {scores[bad][:5].tolist()}.")
        zeros = torch.zeros(batch_size, dtype=torch.long, device=scores.device)
        return zeros, torch.where(observed, scores, 0.0), observed, torch.ones_like(zeros, dtype=torch.bool)

    def loss(self, logits: torch.Tensor, labels: Any = None, expert_labels: Any = None, reduction: str = "mean",
             check: bool = True, *, expert_correct: Any = None) -> torch.Tensor:
        """The loss: the masked binary log loss summed over the experts, averaged over the rows (``"mean"``), summed
        (``"sum"``) or per row (``"none"``). Only ``expert_correct`` is accepted as targets (see
        [`check_expert_targets`])."""
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
        u = self.check_logits(logits, check_values=check)
        _, correct, observed, _ = self.check_expert_targets(labels, expert_labels, u.shape[0], u.device, check,
                                                            expert_correct=expert_correct)
        per_example = F.binary_cross_entropy_with_logits(u, correct, weight=observed.float(), reduction="none").sum(1)
        if reduction == "none":
            return per_example
        return per_example.mean() if reduction == "mean" and u.shape[0] else per_example.sum()

    __call__ = loss

    # ------------------------------------------------------------------ estimates and decision
    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return u.new_zeros(u.shape[0], 0), F.logsigmoid(u)

    def _margin(self, u: torch.Tensor, costs: torch.Tensor | None,
                available: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``max_{j != d, available} (a_j - c_j) - (a_d - c_d)`` (float64; ``-inf`` where no other expert is
        available, ``+inf`` where ``d`` is not and another is) and the ``argmax`` over those other experts."""
        gains = torch.sigmoid(u.double())
        if costs is not None:
            gains = gains - costs.to(gains)
        return self._split(gains, available)

    def _split(self, gains: torch.Tensor, available: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.default_expert
        others = gains.clone()
        others[:, d] = float("-inf")
        if available is not None:
            others = others.masked_fill(~available.to(others.device), float("-inf"))
        best, expert = others.max(dim=1)
        margin = best - gains[:, d]
        if available is not None:  # the default expert excluded: any available other one answers (margin +inf)
            forced = ~available.to(margin.device)[:, d] & torch.isfinite(best)
            margin = margin.masked_fill(forced, float("inf"))
        return margin, expert

    def _decide(self, u: torch.Tensor, costs: torch.Tensor | None = None, defer_threshold: float = 0.0,
                available: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """`decide` on checked logits. Returns ``defer [B]``, ``chosen [B]`` (the expert that answers: the default
        where not deferred) and ``chosen`` again (the slot of a deferral model's expert)."""
        defer_threshold = check_defer_threshold(defer_threshold)
        if costs is None and defer_threshold == 0:  # the exact logit rule: sigmoid is increasing
            margin, expert = self._split(u, available)
        else:
            margin, expert = self._margin(u, costs, available)
        defer = margin > defer_threshold
        chosen = torch.where(defer, expert, torch.full_like(expert, self.default_expert))
        return defer, chosen, chosen


def is_route_only(config: Any) -> bool:
    """Whether `config` (a [`DeferralConfig`], or a model or anything else with a `.config`) describes a route-only
    model, an [`EncoderForRouting`]: `model_type` ``"deferral"`` and `route_only=True`. `False` for anything else
    (another model type, `None`), so that callers need not check the type first.

    Example:

    ```python
    >>> from hf_defer import DeferralConfig
    >>> from hf_defer.modeling.surrogate_routing import is_route_only
    >>> is_route_only(DeferralConfig(feature_size=4, route_only=True, num_experts=2)), is_route_only(None)
    (True, False)

    ```
    """
    config = getattr(config, "config", config)
    return getattr(config, "model_type", None) == "deferral" and getattr(config, "route_only", False) is True


def _all_ignored(labels: Any) -> bool:
    """Whether `labels` holds only -100 (a collator's padding of a column the route-only model does not have)."""
    try:
        values = torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError):
        return False
    return bool((values == IGNORE_INDEX).all())


def route_only_output(surrogate: RouteOnlySurrogate, config: Any, logits: torch.Tensor, costs: list[float] | None,
                      threshold: float, available: torch.Tensor | None, return_margin: bool = False) -> dict[str, Any]:
    """The deferral pipeline's answer for one input of a route-only model (its `postprocess`).

    Returns:
        `dict`: ``label`` and ``expert`` (the chosen expert's name: the default one unless deferred), ``defer``
        (routed away from the default expert), ``estimated_accuracy`` (the chosen expert's ``a_j``), ``cost`` (its
        ``c_j``), ``expert_accuracy`` (list) and ``expert_scores`` (by name); with ``return_margin``, ``margin``.
    """
    paid = surrogate.check_costs(costs)
    if available is not None and not bool(torch.as_tensor(available).any()):
        raise ValueError(f"available_experts leaves no expert for this input, and a route-only model has no answer of "
                         f"its own: allow at least one of {list(config.expert_names)} (the default, "
                         f"{config.default_expert!r}, counts only when listed).")
    defer, chosen, _ = (int(t[0]) for t in surrogate._decide(logits, paid, threshold, available))
    accuracy = [float(a) for a in torch.sigmoid(logits[0].float())]
    name = config.expert_names[chosen]
    output = {
        "label": name,
        "defer": bool(defer),
        "expert": name,
        "estimated_accuracy": accuracy[chosen],
        "cost": 0.0 if paid is None else float(paid[chosen]),
        "expert_accuracy": accuracy,
        "expert_scores": dict(zip(config.expert_names, accuracy)),
    }
    if return_margin:
        output["margin"] = float(surrogate._margin(logits, paid, available)[0][0])
    return output
