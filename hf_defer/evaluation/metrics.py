"""Deferral metrics of Cao et al. (2023), appendix "Details of Evaluation Metrics".

All metrics are fractions in [0, 1]. Rows whose label is -100 (Hugging Face padding) are dropped first. The
reliability diagrams and ECE functions live in ``reliability.py`` and are re-exported here. Per-expert keys carry the
expert's name ([`expert_keys`]): ``expert_ece_alice``, ``deferral_rate_alice``; numbers only where no name is known.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np
import torch

from .reliability import (  # noqa: F401  (pool_reliability, reliability_ece, MAX_BINS: re-exported)
    MAX_BINS,
    expected_calibration_error,
    pool_reliability,
    reliability_bins,
    reliability_ece,
)
from .costs import mean_cost
from .metrics_routing import route_only_metrics
from ..modeling.validators import check_share, is_int
from ..modeling.surrogates import DeferralSurrogate, RouteOnlySurrogate, get_surrogate, surrogate_for_config
from ..modeling.surrogate_routing import is_route_only


def _as_tensor(name: str, values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu()
    try:
        return torch.as_tensor(np.asarray(values))
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} must be a rectangular array of numbers, got {type(values).__name__} ({err}).") from None


def _check_budgets(budgets: Any) -> list[float]:
    if isinstance(budgets, (str, bytes)) or not (isinstance(budgets, Sequence) or np.ndim(budgets) == 1):
        raise ValueError(f"budgets must be a sequence of numbers in (0, 1], got {budgets!r}.")
    for budget in budgets:
        check_share(budget, "budgets")
    return [float(str(budget)) for budget in budgets]  # str: np.float32(0.1) is the budget 0.1


def _budget_key(budget: float) -> str:
    """``budgeted_error_{100 x}``, the percentage written exactly: 0.1 gives ``budgeted_error_10``, 0.096
    ``budgeted_error_9.6`` and 0.004 ``budgeted_error_0.4``, so that two different budgets never share a key."""
    percent = Decimal(repr(float(budget))) * 100  # exact: the shortest decimal of the float, times 100
    return f"budgeted_error_{format(percent.normalize(), 'f')}"


BUDGET_RANKINGS: tuple[str, ...] = ("expert_accuracy", "margin")
"""How a budget picks the deferred inputs that stay deferred; see [`budget_deferrals`]."""


def budget_deferrals(deferred: Any, score: Any, max_deferral_rate: float) -> np.ndarray:
    """The one deferral budget: of ``N`` inputs, at most ``floor(max_deferral_rate * N)`` stay deferred.

    When more are deferred, those with the highest ``score`` stay (ties: earlier input first) and the classifier
    answers the rest. [`deferral_metrics`] ranks by the estimated accuracy of each input's expert (the paper's
    budgeted error) or by the deferral margin; [`calibrate_deferral`] ranks by the margin and puts the threshold
    between the last margin kept and the highest margin left out.

    Args:
        deferred (array-like of `bool`, shape `[N]`): the inputs the decision rule defers.
        score (array-like of `float`, shape `[N]`): the ranking score of each input.
        max_deferral_rate (`float`): the budget, in (0, 1].

    Returns:
        `np.ndarray` of `bool`: the inputs that stay deferred.

    Example:

    ```python
    >>> from hf_defer.evaluation.metrics import budget_deferrals
    >>> budget_deferrals([True, True, False, True], [0.2, 0.9, 0.99, 0.9], max_deferral_rate=0.5).tolist()
    [False, True, False, True]

    ```
    """
    deferred = np.asarray(deferred, dtype=bool)
    score = np.asarray(score, dtype=np.float64)
    check_share(max_deferral_rate, "max_deferral_rate")
    cap = math.floor(max_deferral_rate * deferred.shape[0] + 1e-9)
    rows = np.flatnonzero(deferred)
    if rows.size <= cap:
        return deferred.copy()
    kept = np.zeros(deferred.shape[0], dtype=bool)
    kept[rows[np.argsort(-score[rows], kind="stable")[:cap]]] = True
    return kept


def expert_keys(expert_names: Sequence[str] | None, num_experts: int) -> list[str]:
    """The suffix of each expert's per-expert metric keys (``expert_ece_<suffix>``, ``deferral_rate_<suffix>``).

    A name becomes its word characters, other runs joined by ``_`` (``"gpt-4o mini"`` gives ``gpt_4o_mini``); the
    default names ``expert_0, expert_1, ...`` and no names at all give the numbers ``0, 1, ...``; an empty result or
    a clash with an earlier expert's key takes ``_<index>``, so the keys are distinct.

    Example:

    ```python
    >>> from hf_defer.evaluation.metrics import expert_keys
    >>> expert_keys(["alice", "Dr. Who", "expert_2", "dr who"], 4)
    ['alice', 'Dr_Who', '2', 'dr_who']
    >>> expert_keys(None, 2), expert_keys(["a b", "a_b"], 2)
    (['0', '1'], ['a_b', 'a_b_1'])

    ```
    """
    if expert_names is None:
        return [str(j) for j in range(num_experts)]
    if isinstance(expert_names, str) or len(expert_names) != num_experts or not all(
            isinstance(name, str) for name in expert_names):
        raise ValueError(f"expert_names must be {num_experts} names (str), one per expert, got {expert_names!r}.")
    keys: list[str] = []
    for j, name in enumerate(expert_names):
        key = str(j) if name == f"expert_{j}" else re.sub(r"\W+", "_", name).strip("_")
        if not key or key in keys:
            key = f"{key}_{j}" if key else str(j)
        while key in keys:
            key += "_"
        keys.append(key)
    return keys


def _read_config(surrogate: Any, num_experts: int, width: int) -> tuple[DeferralSurrogate, Any, float, Any]:
    """The surrogate, costs, threshold and expert names that ``surrogate`` (a name, a surrogate, a config or a model)
    stands for."""
    config = getattr(surrogate, "config", surrogate)
    if getattr(config, "model_type", None) == "deferral":
        scorer = surrogate_for_config(config)  # a route-only config gives a RouteOnlySurrogate
        return scorer, getattr(config, "expert_costs", None), float(config.defer_threshold), config.expert_names
    if isinstance(surrogate, DeferralSurrogate):
        return surrogate, None, 0.0, None
    if not is_int(num_experts) or num_experts < 1:
        raise ValueError(f"num_experts must be an integer >= 1, got {num_experts!r}.")
    num_experts = int(num_experts)
    if width - num_experts < 2:
        raise ValueError(
            f"logits must have num_classes + num_experts columns with num_classes >= 2; with num_experts="
            f"{num_experts} that needs at least {num_experts + 2} columns, got {width}."
        )
    return get_surrogate(surrogate, width - num_experts, num_experts), None, 0.0, None


class _Rows(NamedTuple):
    """The rows that are evaluated (label not -100), as the surrogate checked them."""

    logits: torch.Tensor  # [n, K + M]
    y: torch.Tensor  # [n] the true classes
    correct: torch.Tensor  # [n, M] each expert's correctness or score
    observed: torch.Tensor  # [n, M] whether each expert answered
    allowed: torch.Tensor | None  # [n, M] who may be deferred to; None: everyone


def _evaluated_rows(scorer: DeferralSurrogate, logits: torch.Tensor, labels: Any, expert_labels: Any,
                    expert_correct: Any, available: Any) -> _Rows:
    """Checks the logits, labels, expert targets and availability, and keeps the rows whose label is not -100."""
    logits = scorer.check_logits(logits)
    if expert_correct is not None:
        expert_correct = _as_tensor("expert_correct", expert_correct)
    elif expert_labels is not None:
        expert_labels = _as_tensor("expert_labels", expert_labels)
    y, correct, observed, valid = scorer.check_expert_targets(
        _as_tensor("labels", labels), expert_labels, logits.shape[0], expert_correct=expert_correct)
    allowed = scorer.check_available(None if available is None else _as_tensor("available", available),
                                     logits.shape[0])
    # Who may be asked is what the pipeline is told (`available`), never who happened to answer: at decision time
    # nobody knows that. A deferral to an expert without a recorded answer is counted apart (unscored).
    return _Rows(logits[valid], y[valid], correct[valid], observed[valid], None if allowed is None else allowed[valid])


class _Decisions(NamedTuple):
    """The pipeline's decision on each evaluated row, with what scores it."""

    y: np.ndarray  # [n] the true classes
    defer: np.ndarray  # [n] bool: deferred
    prediction: np.ndarray  # [n] the classifier's answer
    expert: np.ndarray  # [n] the chosen expert
    paid: torch.Tensor | None  # [M] the experts' costs; None: all free
    accuracy: np.ndarray  # [n, M] each expert's estimated accuracy
    correct: np.ndarray  # [n, M] each expert's correctness or score
    observed: np.ndarray  # [n, M] whether each expert answered
    rank_score: np.ndarray  # [n] what a budget keeps deferrals by
    classifier_wrong: np.ndarray  # [n] 1.0 where the classifier's answer is wrong
    chosen_wrong: np.ndarray  # [n] 1 - the chosen expert's correctness (read only where deferred and answered)
    chosen_answered: np.ndarray  # [n] bool: the chosen expert answered

    @property
    def unscored(self) -> np.ndarray:
        """[n] bool: deferred to an expert with no recorded answer, so neither right nor wrong."""
        return self.defer & ~self.chosen_answered

    @property
    def sparse(self) -> bool:
        """Whether some expert's answer is missing."""
        return not bool(self.observed.all())

    def system_error(self, deferred: np.ndarray) -> float:
        """The mean 0-1-deferral loss when ``deferred`` are deferred, over the rows that can be scored."""
        scored = ~deferred | self.chosen_answered  # an unscored deferral is neither right nor wrong: left out
        if not scored.any():
            return float("nan")
        return float(np.mean(np.where(deferred, self.chosen_wrong, self.classifier_wrong)[scored]))


def _decide(scorer: DeferralSurrogate, rows: _Rows, costs: Any, threshold: float, budget_ranking: str) -> _Decisions:
    """The pipeline's decision on each row (defer or not, answer, chosen expert) and the score budgets rank by."""
    n = int(rows.y.shape[0])
    if n == 0:
        raise ValueError("labels has no row to evaluate: every label is -100.")
    allowed = rows.allowed
    if allowed is not None and bool(allowed.all()):
        allowed = None  # every expert may be asked: the decision of a model with no mask
    # The logits were checked by _evaluated_rows: the unchecked forms, so each is read once.
    paid = scorer.check_costs(costs)
    defer, prediction, expert = (t.numpy() for t in scorer._decide(rows.logits, paid, threshold, allowed))
    _, accuracy = scorer._probabilities(rows.logits)
    accuracy = accuracy.double().numpy()
    y, correct, observed = rows.y.numpy(), rows.correct.double().numpy(), rows.observed.numpy()
    index = np.arange(n)
    if budget_ranking == "margin":
        rank_score = scorer._margin(rows.logits, paid, allowed)[0].numpy()
    else:
        rank_score = accuracy[index, expert]
    return _Decisions(y=y, defer=defer, prediction=prediction, expert=expert, paid=paid, accuracy=accuracy,
                      correct=correct, observed=observed, rank_score=rank_score,
                      classifier_wrong=(prediction != y).astype(np.float64),
                      chosen_wrong=1.0 - correct[index, expert], chosen_answered=observed[index, expert])


def _system_metrics(d: _Decisions) -> dict[str, Any]:
    """``system_error``, ``coverage``, ``classifier_error``, ``majority_class_error`` and the unscored counts."""
    n = d.y.shape[0]
    metrics: dict[str, Any] = {
        "system_error": d.system_error(d.defer),
        "coverage": float(1.0 - d.defer.mean()),
        "classifier_error": float(1.0 - (d.prediction == d.y).mean()),  # as computed before: the same float bits
        "majority_class_error": float(1.0 - np.bincount(d.y).max() / n),
    }
    if d.sparse:  # some answer is missing: how many deferrals could not be scored, and on how many rows the error is
        metrics["unscored_deferrals"] = int(d.unscored.sum())
        metrics["scored_rows"] = int(n - d.unscored.sum())
    return metrics


def _expert_metrics(d: _Decisions, keys: list[str], n_bins: int, soft: bool) -> tuple[dict[str, Any], list[Any]]:
    """``expert_ece`` and, with ``M > 1``, each expert's ECE, deferral rate and unscored deferrals; the diagrams."""
    M = d.observed.shape[1]
    # soft (scores): the ECE compares the estimate with the mean score of each bin
    diagrams = [reliability_bins(d.accuracy[d.observed[:, j], j], d.correct[d.observed[:, j], j], n_bins, soft=soft)
                for j in range(M)]
    eces = {j: reliability_ece(diagram) for j, diagram in enumerate(diagrams) if d.observed[:, j].any()}
    metrics: dict[str, Any] = {}
    if eces:
        metrics["expert_ece"] = float(np.mean(list(eces.values())))
    if M > 1:
        for j, ece in eces.items():
            metrics[f"expert_ece_{keys[j]}"] = ece
        for j in range(M):
            metrics[f"deferral_rate_{keys[j]}"] = float(np.mean(d.defer & (d.expert == j)))
            if d.sparse:
                metrics[f"unscored_deferrals_{keys[j]}"] = int(np.sum(d.unscored & (d.expert == j)))
    return metrics, diagrams


def _cost_metrics(d: _Decisions) -> dict[str, float]:
    """``mean_cost`` when some expert cost is not 0: a deferred input pays its expert's price."""
    return {} if d.paid is None else {"mean_cost": mean_cost(d.defer, d.expert, d.paid.tolist())}


def _budgeted_errors(d: _Decisions, budgets: list[float]) -> dict[str, float]:
    """``budgeted_error_{100x}``: the system error when at most ``floor(x N)`` inputs stay deferred."""
    return {_budget_key(budget): d.system_error(budget_deferrals(d.defer, d.rank_score, budget)) for budget in budgets}


def deferral_metrics(
    logits: Any,
    labels: Any,
    expert_labels: Any = None,
    surrogate: Any = "asm",
    num_experts: int = 1,
    n_bins: int = 15,
    budgets: Sequence[float] = (0.1, 0.2, 0.3),
    return_reliability: bool = False,
    *,
    expert_costs: Any = None,
    defer_threshold: float | None = None,
    budget_ranking: str = "expert_accuracy",
    expert_correct: Any = None,
    available: Any = None,
    expert_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Evaluates a deferral model from its logits, with the decision of [`DeferralSurrogate.decide`].

    Inputs are deferred by the one decision rule, ``max_j (a_j - c_j) - max_y p(y|x) > defer_threshold``; with zero
    costs and threshold (the default for a surrogate name) that is the paper's logit rule. Given a model or its
    config, the costs and threshold default to the config's, so the numbers are those of its pipeline.

    * ``system_error``: mean 0-1-deferral loss (classifier wrong where it answers, chosen expert wrong where
      the input is deferred).
    * ``coverage``: share of inputs the classifier answers. ``classifier_error``: error of
      ``argmax_{y<=K}`` on all inputs.
    * ``expert_ece``: ECE (``n_bins`` equal-width bins) of the expert-accuracy estimate against
      ``[[m = y]]`` over all inputs. With ``M > 1`` experts, ``expert_ece_<name>`` for each expert (against that
      expert's correctness; ``<name>`` from [`expert_keys`], the expert's index where no names are known) and
      ``expert_ece`` their mean; ``deferral_rate_<name>`` is the share routed to that expert.
    * ``mean_cost`` (when some expert cost is not 0): the mean price paid per input, each deferred input paying the
      cost of its expert ([`hf_defer.evaluation.costs.mean_cost`]).
    * ``budgeted_error_{100x}`` for each ``x`` in ``budgets``: the system error when at most ``floor(x N)`` inputs
      stay deferred ([`budget_deferrals`]). With ``budget_ranking="expert_accuracy"`` (the paper's definition, the
      default) the deferred inputs with the highest estimated (clipped) accuracy of their expert stay; with
      ``"margin"`` those with the highest deferral margin, which is what [`calibrate_deferral`] with
      ``max_deferral_rate=x`` followed by the pipeline delivers on the same inputs (when no two margins tie). The key
      writes the percentage exactly (``budgeted_error_10`` for 0.1, ``budgeted_error_9.6`` for 0.096), so two
      budgets never share a key.

    * ``majority_class_error``: the error of always answering the most frequent class of these labels, the baseline
      that ``classifier_error`` should beat.

    Sparse answers (an expert's answer -100 on some row): the decisions are those the pipeline makes on these inputs,
    with no knowledge of who answered (at decision time nobody knows): an expert is deferred to where ``available``
    allows it (all experts when not given; none available: the classifier answers), whether or not its answer was
    recorded. ``coverage`` and ``deferral_rate_<name>`` are the rates of these decisions, on all rows. A deferral to an
    expert with no recorded answer cannot be scored: it is counted in ``unscored_deferrals`` (and
    ``unscored_deferrals_<name>`` per expert with ``M > 1``), never turned into a classifier answer, and
    ``system_error`` and the budgeted errors are the means over the rows they can score (``scored_rows`` of them for
    ``system_error``; `nan` when none). These three keys appear only when some answer is missing. Each expert's ECE is
    over the rows it answered (an expert with none gets no ``expert_ece_<name>`` and stays out of ``expert_ece``).
    With scores (``expert_correct`` in [0, 1]), a deferred input counts ``1 - score`` as its error (the expected error)
    and the ECE compares the estimates with the mean score per bin. Per-expert keys use the expert names
    ([`expert_keys`]) of ``expert_names`` or of the config.

    Args:
        logits (`np.ndarray` or `torch.Tensor` of shape `[N, K + M]`): model outputs.
        labels (array-like of shape `[N]`): true classes; rows equal to -100 are dropped.
        expert_labels (array-like of shape `[N]` or `[N, M]`): the experts' predictions, -100 where one did not answer.
        surrogate (`str`, [`DeferralSurrogate`], [`DeferralConfig`] or model, *optional*, defaults to `"asm"`): what
            reads the logits: a surrogate name (with ``num_experts``), a surrogate, or a deferral model or its
            config (surrogate, experts, ``expert_costs`` and ``defer_threshold`` from the config).
        num_experts (`int`, *optional*, defaults to 1): ``M``, with a surrogate name only.
        n_bins (`int`, *optional*, defaults to 15): ECE bins.
        budgets (sequence of `float`, *optional*): deferral budgets in (0, 1].
        return_reliability (`bool`, *optional*, defaults to `False`): also return ``"reliability"``, the
            reliability-diagram data of [`reliability_bins`] (a list with one entry per expert when ``M > 1``).
        expert_costs (sequence of `float`, *optional*): one cost per expert; defaults to the config's, else zeros.
        defer_threshold (`float`, *optional*): defaults to the config's, else 0.
        budget_ranking (`str`, *optional*, defaults to `"expert_accuracy"`): `"expert_accuracy"` or `"margin"`.
        expert_correct (array-like of shape `[N]` or `[N, M]`, *optional*): instead of `expert_labels`, whether each
            expert was right (bool, 0/1) or its score in [0, 1]; -100 where there is none.
        available (bool array-like `[N, M]` or `[M]`, *optional*): who may be deferred to (the pipeline's
            ``available_experts``); all experts when not given.
        expert_names (list of `str`, *optional*): names for the per-expert keys; defaults to the config's.

    Returns:
        `dict[str, float]` (plus ``"reliability"`` on request).

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer import deferral_metrics
    >>> logits = np.array([[3.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 4.0]])  # K = 3 classes, 1 expert
    >>> metrics = deferral_metrics(logits, labels=[0, 2], expert_labels=[1, 2])
    >>> metrics["system_error"], metrics["coverage"]
    (0.0, 0.5)
    ```
    """
    logits = _as_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, num_classes + num_experts], got {tuple(logits.shape)}.")
    if budget_ranking not in BUDGET_RANKINGS:
        raise ValueError(f"budget_ranking must be one of {BUDGET_RANKINGS}, got {budget_ranking!r}.")
    scorer, config_costs, config_threshold, config_names = _read_config(surrogate, num_experts, logits.shape[1])
    costs = config_costs if expert_costs is None else expert_costs
    threshold = config_threshold if defer_threshold is None else defer_threshold
    names = config_names if expert_names is None else expert_names
    if isinstance(scorer, RouteOnlySurrogate):  # no class head: the chosen expert's targets only
        scorer.check_expert_targets(labels, expert_labels, logits.shape[0], expert_correct=expert_correct)
        return route_only_metrics(logits, expert_correct, scorer, expert_costs=costs, defer_threshold=threshold,
                                  n_bins=n_bins, expert_names=expert_keys(names, scorer.num_experts),
                                  budgets={_budget_key(b): b for b in _check_budgets(budgets)},
                                  budget_ranking=budget_ranking, return_reliability=return_reliability,
                                  available=available, budget=budget_deferrals)
    keys = expert_keys(names, scorer.num_experts)
    rows = _evaluated_rows(scorer, logits, labels, expert_labels, expert_correct, available)
    budgets = _check_budgets(budgets)
    decisions = _decide(scorer, rows, costs, threshold, budget_ranking)
    expert_metrics, diagrams = _expert_metrics(decisions, keys, n_bins, soft=expert_correct is not None)
    metrics = {**_system_metrics(decisions), **expert_metrics, **_cost_metrics(decisions),
               **_budgeted_errors(decisions, budgets)}
    if return_reliability:
        metrics["reliability"] = diagrams[0] if len(diagrams) == 1 else diagrams
    return metrics


def expert_targets(targets: Any) -> dict[str, torch.Tensor]:
    """The experts' targets as the keyword that [`deferral_metrics`] and the losses take: integers are the experts'
    answers (``expert_labels``), floats their correctness or scores (``expert_correct``), as a Trainer gathers them.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.evaluation.metrics import expert_targets
    >>> list(expert_targets(np.array([[1, -100]]))), list(expert_targets(np.array([[0.5, -100.0]])))
    (['expert_labels'], ['expert_correct'])

    ```
    """
    array = np.asarray(targets.detach().cpu() if isinstance(targets, torch.Tensor) else targets)
    return {"expert_correct" if np.issubdtype(array.dtype, np.floating) else "expert_labels": torch.as_tensor(array)}


class DeferralMetrics:
    """``compute_metrics`` for [`~transformers.Trainer`]: [`deferral_metrics`] on an ``EvalPrediction``.

    The Trainer hands over ``predictions`` (the logits, or a tuple whose first item is the logits) and
    ``label_ids = (labels, expert_labels)`` padded with -100; padded rows are dropped.

    Args:
        surrogate (`str`, [`DeferralConfig`] or model, *optional*, defaults to `"asm"`): the surrogate the model was
            trained with, or the model's config (then its costs and threshold decide, read at each evaluation).
        num_experts (`int`, *optional*, defaults to 1): number of experts ``M`` (with a surrogate name).
        n_bins (`int`, *optional*, defaults to 15): ECE bins.
        budgets (sequence of `float`, *optional*): deferral budgets for the budgeted errors.
        budget_ranking (`str`, *optional*, defaults to `"expert_accuracy"`): see [`deferral_metrics`].
        expert_names (list of `str`, *optional*): names for the per-expert keys; defaults to the config's.

    The second entry of ``label_ids`` holds the experts' answers (integers, -100 where missing), or their correctness
    or scores (floats: the ``expert_correct`` column, which [`DeferralTrainer`] gathers instead when a dataset has it).

    Example:

    ```python
    >>> import numpy as np
    >>> from transformers import EvalPrediction
    >>> from hf_defer import DeferralMetrics
    >>> compute_metrics = DeferralMetrics("asm", num_experts=1)
    >>> prediction = EvalPrediction(np.array([[2.0, 0.0, 1.0]]), (np.array([0]), np.array([1])))
    >>> compute_metrics(prediction)["system_error"]
    0.0
    ```
    """

    def __init__(
        self,
        surrogate: Any = "asm",
        num_experts: int = 1,
        n_bins: int = 15,
        budgets: Sequence[float] = (0.1, 0.2, 0.3),
        budget_ranking: str = "expert_accuracy",
        expert_names: Sequence[str] | None = None,
    ) -> None:
        self.surrogate, self.num_experts, self.n_bins, self.budgets = surrogate, num_experts, n_bins, tuple(budgets)
        self.budget_ranking, self.expert_names = budget_ranking, expert_names

    def __call__(self, eval_prediction: Any) -> dict[str, float]:
        logits = eval_prediction.predictions
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        label_ids = eval_prediction.label_ids
        if is_route_only(self.surrogate):
            return deferral_metrics(logits, None, surrogate=self.surrogate, n_bins=self.n_bins, budgets=self.budgets,
                                    budget_ranking=self.budget_ranking, expert_names=self.expert_names,
                                    expert_correct=label_ids)  # a route-only model's one target: expert_correct
        if not isinstance(label_ids, (tuple, list)) or len(label_ids) != 2:
            raise ValueError(
                "label_ids must be the pair (labels, expert_labels); set TrainingArguments(label_names=['labels', "
                f"'expert_labels']) or use DeferralTrainer. Got {type(label_ids).__name__}."
            )
        labels, targets = label_ids
        return deferral_metrics(logits, labels, surrogate=self.surrogate, num_experts=self.num_experts,
                                n_bins=self.n_bins, budgets=self.budgets, budget_ranking=self.budget_ranking,
                                expert_names=self.expert_names, **expert_targets(targets))


METRIC_NAMES: dict[str, tuple[str, str]] = {
    "system_error": ("System error", "error of the classifier-plus-expert system (the expert's error where deferred)"),
    "coverage": ("Coverage", "share of inputs the classifier answers (not deferred)"),
    "classifier_error": ("Classifier error", "error of the classifier alone, on all inputs"),
    "expert_ece": ("Expert ECE", "calibration error of the expert-accuracy estimate (15 bins)"),
    "mean_cost": ("Mean cost", "mean price paid per input (a deferred input pays its expert's cost)"),
    "majority_class_error": ("Majority-class error", "error of always answering the most frequent class (baseline)"),
    "unscored_deferrals": ("Unscored deferrals", "inputs deferred to an expert with no recorded answer (not scored)"),
    "scored_rows": ("Scored rows", "inputs the system error is measured on (all but the unscored deferrals)"),
}
"""Display name and meaning of each fixed key of [`deferral_metrics`]; [`metric_name_and_meaning`] adds the keys
that carry a budget or an expert (``budgeted_error_10``, ``expert_ece_alice``, ``deferral_rate_1``)."""


def metric_name_and_meaning(key: str, expert_names: Sequence[str] | None = None) -> tuple[str, str]:
    """Display name and one-line meaning of a key of [`deferral_metrics`] (for cards, tables and logs).

    Args:
        key (`str`): a metric key such as ``"coverage"`` or ``"budgeted_error_10"`` (no ``eval_`` prefix).
        expert_names (list of `str`, *optional*): the experts' names, to write a per-expert key with the name it was
            made from (``"Dr. Who"`` rather than ``Dr_Who``); without them, the key's own suffix.

    Returns:
        `tuple[str, str]`: the name and its meaning.

    Raises:
        `ValueError`: ``key`` is not a key [`deferral_metrics`] returns.

    Example:

    ```python
    >>> from hf_defer.evaluation.metrics import metric_name_and_meaning
    >>> metric_name_and_meaning("budgeted_error_10")[0]
    'Budgeted error @ 10%'

    ```
    """
    if key in METRIC_NAMES:
        return METRIC_NAMES[key]
    match = re.fullmatch(r"(budgeted_error|expert_ece|deferral_rate|unscored_deferrals)_(\w+?|\d+\.\d+)", key) \
        if isinstance(key, str) else None
    suffix = match.group(2) if match else ""
    if not match or (match.group(1) == "budgeted_error" and not re.fullmatch(r"\d+(\.\d+)?", suffix)):
        raise ValueError(f"key must be a key of deferral_metrics (e.g. {tuple(METRIC_NAMES)}), got {key!r}.")
    if match.group(1) == "budgeted_error":
        return f"Budgeted error @ {suffix}%", f"system error when at most {suffix}% of inputs may be deferred"
    names = dict(zip(expert_keys(expert_names, len(expert_names)), expert_names)) if expert_names else {}
    who = names.get(suffix, f"expert {suffix}" if suffix.isdigit() else suffix)
    if match.group(1) == "expert_ece":
        return f"Expert ECE ({who})", f"calibration error of {who}'s accuracy estimate, on the inputs {who} answered"
    if match.group(1) == "unscored_deferrals":
        return f"Unscored deferrals ({who})", f"inputs deferred to {who} where {who} has no recorded answer"
    return f"Deferral rate ({who})", f"share of inputs deferred to {who}"
