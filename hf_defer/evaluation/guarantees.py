"""Deferral thresholds that keep a promise on new inputs with a stated confidence (finite-sample, distribution-free).

Every function here works on per-input arrays of a calibration sample: the deferral margin of each input (the pipeline
defers iff ``margin > t``; ``-inf`` where nobody is available, never deferred and still counted), and, for the error
and cost targets, what each input would lose if kept or if deferred. The one assumption: the calibration inputs and
the new ones are independent draws from the same distribution. "With confidence 0.9" means: over the draw of the
calibration sample, the promise holds on the population in at least 90 % of draws.

* A deferral budget ([`budget_threshold`]): the exact binomial bound on the population quantile of the margin.
* An error target ([`error_threshold`]), the system error or the selective error: Learn-then-Test (Angelopoulos et
  al. 2021) with fixed-sequence testing over a fixed lattice of thresholds, from most deferral to least.
* A mean-cost budget, per-expert budgets and all of these together: [`certify_threshold`], one confidence shared
  by a Bonferroni split.

The p-values and the fixed-sequence test for bounded losses come from MAPIE's `risk_control` (`pip install
hf-defer[guarantees]`); scipy's binomial law gives the exact bounds for 0/1 losses and deferral counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from ..modeling.validators import check_share, is_number


# Learn-then-Test over deferral thresholds (Angelopoulos, Bates, Candes, Jordan, Lei 2021): the lattice of thresholds
# tested, the p-values and the fixed-sequence test, for certify_threshold.

LTT_GRID_STEP = 1e-4
"""The thresholds Learn-then-Test tests: ``0, 1e-4, 2e-4, ...`` (margins are differences of probabilities), fixed
before the data are seen, as fixed-sequence testing needs; up to the first one above every calibration margin."""

EXACT_LTT = "Learn-then-Test, fixed-sequence, exact binomial p-values"
HB_LTT = "Learn-then-Test, fixed-sequence, Hoeffding-Bentkus p-values"


def _hoeffding_bentkus() -> Any:
    """MAPIE's Hoeffding-Bentkus p-value (an extra: `pip install hf-defer[guarantees]`)."""
    try:
        from mapie.risk_control.methods import compute_hoeffding_bentkus_p_value
    except ImportError as error:  # pragma: no cover - the extra is part of the test install
        raise ImportError("error targets on losses other than 0/1, and cost budgets, need MAPIE: pip install "
                          "'hf-defer[guarantees]'.") from error
    return compute_hoeffding_bentkus_p_value


def _binom() -> Any:
    try:
        from scipy.stats import binom
    except ImportError as error:  # pragma: no cover
        raise ImportError("guarantees with a confidence need scipy: pip install 'hf-defer[guarantees]'.") from error
    return binom


def _lattice(margins: np.ndarray) -> np.ndarray:
    """``0, step, 2 step, ...`` up to the first point above every finite margin (beyond it every point decides alike
    on these inputs)."""
    finite = margins[np.isfinite(margins)]
    top = float(finite.max()) if finite.size else 0.0
    count = max(0, math.floor(top / LTT_GRID_STEP)) + 2
    while (count - 1) * LTT_GRID_STEP <= top:
        count += 1
    return np.arange(count) * LTT_GRID_STEP


def _clear(margins: np.ndarray, points: np.ndarray, unit: float) -> np.ndarray:
    """Which ``points`` lie at least ``unit`` (times the largest margin when that exceeds 1) from every margin."""
    finite = np.sort(margins[np.isfinite(margins)])
    if finite.size == 0:
        return np.ones(points.shape, dtype=bool)
    tolerance = unit * max(1.0, float(finite[-1]))
    at = np.clip(np.searchsorted(finite, points), 1, finite.size) - 1
    nearest = np.minimum(np.abs(points - finite[at]), np.abs(points - finite[np.minimum(at + 1, finite.size - 1)]))
    return nearest >= tolerance


def _above(margins: np.ndarray, values: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each point ``t``: the sum of ``values`` over the inputs with ``margin > t``, and their number."""
    order = np.argsort(margins, kind="stable")
    suffix = np.append(np.cumsum(values[order][::-1])[::-1], 0.0)
    index = np.searchsorted(margins[order], points, side="right")
    return suffix[index], margins.size - index


def _p_values(total: np.ndarray, n_obs: np.ndarray, target: float, binary: bool) -> np.ndarray:
    """p-values of ``H: risk > target`` from the summed losses: exact binomial for 0/1 losses, else MAPIE's
    Hoeffding-Bentkus (valid for any loss in [0, 1]); 1 where nothing was observed. Neighbouring thresholds between
    the same two margins share their sums: each run of equal ones is computed once."""
    n_obs = np.asarray(n_obs, dtype=np.float64)
    new = np.ones(total.shape, dtype=bool)
    new[1:] = (np.diff(total) != 0) | (np.diff(n_obs) != 0)
    total, n_obs, runs = total[new], n_obs[new], np.cumsum(new) - 1
    seen = n_obs > 0
    p = np.ones(total.shape)
    if binary:
        p[seen] = _binom().cdf(np.rint(total[seen]), n_obs[seen], target)
    elif seen.any():
        hoeffding_bentkus = _hoeffding_bentkus()
        p[seen] = hoeffding_bentkus(np.clip(total[seen] / n_obs[seen], 0, 1), n_obs[seen], target)[:, 0]
    return p[runs]


def _fixed_sequence(p_values: np.ndarray, delta: float) -> int:
    """How many hypotheses, in the order given, fixed-sequence testing rejects at level ``delta``: test in order at
    the full level, stop at the first p-value above it. The same rejections as MAPIE's `control_fwer(p_values,
    delta, "fixed_sequence")` (a test checks it), whose Python loop allocates an array per test, quadratic in the
    lattice (0.08 s for 10,000 thresholds, a minute in a 2,000-draw property test); this is linear."""
    above = np.flatnonzero(np.asarray(p_values) > delta)
    return int(above[0]) if above.size else int(len(p_values))


def _certified(total: np.ndarray, n_obs: np.ndarray, target: float, binary: bool, delta: float) -> int:
    """How many lattice points, in the order given, fixed-sequence testing certifies at level ``delta``."""
    return _fixed_sequence(_p_values(total, n_obs, target, binary), delta)


def _smallest_target(total: np.ndarray, n_obs: np.ndarray, delta: float, binary: bool) -> float:
    """The smallest target at which every one of these hypotheses is rejected at level ``delta`` (a bisection: the
    p-values fall as the target rises), rounded up to 4 digits."""
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if bool(np.all(_p_values(total, n_obs, middle, binary) <= delta)):
            high = middle
        else:
            low = middle
    return math.ceil(high * 1e4) / 1e4


def _is_binary(values: np.ndarray) -> bool:
    return bool(np.all((values == 0) | (values == 1)))


def _error_binary(kept_loss: np.ndarray, deferred_loss: np.ndarray, selective: bool) -> bool:
    return _is_binary(kept_loss) and (selective or _is_binary(deferred_loss))


def _error_sums(margins: np.ndarray, kept_loss: np.ndarray, deferred_loss: np.ndarray, selective: bool,
                points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The summed loss and the number of inputs it is over, at each threshold."""
    n = margins.size
    if selective:  # the classifier's losses on the inputs it keeps (margin <= t)
        above, count = _above(margins, kept_loss, points)
        return kept_loss.sum() - above, n - count
    change, _ = _above(margins, deferred_loss - kept_loss, points)
    return kept_loss.sum() + change, np.full(points.size, n)


def _error_threshold(margins: np.ndarray, kept_loss: np.ndarray, deferred_loss: np.ndarray, alpha: float,
                     selective: bool, delta: float, lattice: np.ndarray, clear: np.ndarray, low: float,
                     confidence: float, budgets: bool) -> float:
    """Learn-then-Test over the lattice from ``t = 0``: the certified, clear point with the fewest deferrals at or
    above ``low``."""
    binary = _error_binary(kept_loss, deferred_loss, selective)
    total, n_obs = _error_sums(margins, kept_loss, deferred_loss, selective, lattice)
    certified = _certified(total, n_obs, alpha, binary, delta)
    usable = np.flatnonzero(clear[:certified] & (lattice[:certified] >= low))
    if usable.size:
        return float(lattice[usable[-1]])
    reach = np.flatnonzero(clear & (lattice >= low))
    last = int(reach[0]) if reach.size else lattice.size - 1
    smallest = _smallest_target(total[:last + 1], n_obs[:last + 1], delta, binary)
    what = "selective error" if selective else "system error"
    raise ValueError(
        f"max_error {alpha!r} ({what}) cannot be certified at confidence {confidence!r} with {margins.size} "
        f"calibration inputs{' and these budgets' if budgets else ''}: the smallest max_error certified here is "
        f"{smallest:.4g}" + (" (none below 1: more calibration inputs are needed)" if smallest >= 1 else "") + ".")


def _scaled_costs(margins: np.ndarray, cost_if_deferred: Any, max_mean_cost: Any,
                  cost_bound: float | None) -> tuple[np.ndarray, float, float]:
    """The costs divided by their bound (into [0, 1]), the budget on that scale, and the bound."""
    if not is_number(max_mean_cost) or not max_mean_cost > 0:
        raise ValueError(f"max_mean_cost must be a positive number, got {max_mean_cost!r}.")
    if cost_if_deferred is None:
        raise ValueError("max_mean_cost needs cost_if_deferred: the price each input would cost if deferred.")
    costs = np.asarray(cost_if_deferred, dtype=np.float64)
    if costs.shape != margins.shape:
        raise ValueError(f"cost_if_deferred must have one value per margin (shape {margins.shape}), got "
                         f"{costs.shape}.")
    costs = np.where(np.isneginf(margins), 0.0, costs)
    if not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError("cost_if_deferred must be finite and non-negative (NaN only where the margin is -inf).")
    bound = float(costs.max()) if cost_bound is None else float(cost_bound)
    if not bound >= costs.max() or bound <= 0:
        raise ValueError(f"cost_bound must be positive and at least every cost (largest {costs.max()!r}), got "
                         f"{cost_bound!r}.")
    return costs / bound, float(max_mean_cost) / bound, bound


MARGIN_TOLERANCE = 1e-7
"""Margins closer than twice this (in units of probability, times the largest margin when that exceeds 1) count as
tied: batch composition, padding and kernels change a margin in its last float32 digits between two runs (about 1e-8
on a CPU; a float32 step is 6e-8 at 0.5), so a threshold never sits closer than this to a calibration margin."""

RATE_BOUND = "binomial order statistic (exact)"


def _check_margins(margins: Any) -> np.ndarray:
    values = np.asarray(margins, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"margins must be a non-empty 1-D array (one per calibration input), got shape "
                         f"{values.shape}.")
    if np.isnan(values).any() or np.isposinf(values).any():
        raise ValueError(f"margins must be finite or -inf (nobody available), got NaN or +inf at input "
                         f"{int(np.flatnonzero(np.isnan(values) | np.isposinf(values))[0])}.")
    return values


def _check_losses(name: str, values: Any, n: int, allow_nan: np.ndarray | None = None) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (n,):
        raise ValueError(f"{name} must have one value per margin (shape ({n},)), got shape {values.shape}.")
    bad = np.isnan(values) | (values < 0) | (values > 1)
    if allow_nan is not None:
        bad &= ~(allow_nan & np.isnan(values))
    if bad.any():
        raise ValueError(f"{name} must lie in [0, 1] (NaN only where the margin is -inf), got "
                         f"{values[bad][0]!r} at input {int(np.flatnonzero(bad)[0])}.")
    return np.where(np.isnan(values), 0.0, values)


def _finite(margins: np.ndarray) -> np.ndarray:
    """The margins with ``-inf`` (nobody available) replaced by a finite value below all others and below 0."""
    out = margins.copy()
    low = np.isneginf(out)
    if low.any():
        out[low] = min(0.0, float(out[~low].min(initial=0.0))) - 1.0
    return out


def _threshold_between(margins: np.ndarray, kept: np.ndarray) -> float:
    """The threshold ``t >= 0`` for which ``margin > t`` holds on kept inputs only, at least the tolerance away from
    every margin: 0 when no input left out comes near 0, else the middle of the first gap wider than twice the
    tolerance above the highest margin left out (and 0); above the highest margin when there is none (a budget of
    ``floor(bN) = 0``, or kept margins all tied with one left out): then nothing is deferred."""
    tolerance = MARGIN_TOLERANCE * max(1.0, float(margins.max(initial=0.0)))  # t >= 0: the scale of the top
    left_out = margins[~kept]
    if left_out.size == 0 or left_out.max() < -tolerance:  # the model defers within the budget on its own
        return 0.0
    lower = max(0.0, float(left_out.max()))
    points = np.unique(np.append(margins[margins > lower], lower))  # ascending, from `lower`; all above are kept
    wide = np.flatnonzero(np.diff(points) > 2 * tolerance)
    if wide.size:
        return float((points[wide[0]] + points[wide[0] + 1]) / 2)
    return float(points[-1] + tolerance)


def empirical_budget_threshold(margins: np.ndarray, max_deferral_rate: float,
                               deferred: np.ndarray | None = None) -> float:
    """Today's rule (no confidence): of the inputs deferred at threshold 0 (``deferred``, by default ``margin > 0``),
    keep the ``floor(max_deferral_rate * N)`` with the highest margins ([`budget_deferrals`]) and put the threshold
    between them and the rest ([`_threshold_between`]). It holds the budget on the calibration inputs themselves;
    on new ones the rate exceeds it about half of the time."""
    from .metrics import budget_deferrals

    margins = _finite(_check_margins(margins))
    deferred = margins > 0 if deferred is None else np.asarray(deferred, dtype=bool)
    return _threshold_between(margins, budget_deferrals(deferred, margins, max_deferral_rate))


def binomial_order_statistic(n: int, max_deferral_rate: float, confidence: float) -> int:
    """The largest ``k`` with ``P(Binomial(n, b) <= k - 1) <= 1 - confidence`` (0 when none): a threshold at the
    ``k``-th largest of ``n`` i.i.d. margins leaves more than ``b`` of the population above it with probability
    at most ``1 - confidence``.

    Example:

    ```python
    >>> from hf_defer.evaluation.guarantees import binomial_order_statistic
    >>> binomial_order_statistic(10, 0.5, 0.9)  # P(Bin(10, .5) <= 2) = 56/1024 <= 0.1 < P(<= 3) = 176/1024
    3

    ```
    """
    if max_deferral_rate >= 1:
        return n
    binom, delta = _binom(), 1.0 - confidence
    near = int(binom.ppf(delta, n, max_deferral_rate))  # the answer is within a step of the quantile: look around it
    window = np.arange(max(0, near - 2), min(n, near + 3))
    cdf = binom.cdf(window, n, max_deferral_rate)  # P(Bin <= j), increasing in j
    if window.size and cdf[-1] <= delta and window[-1] < n - 1:  # not expected: fall back on every j
        window = np.arange(n)
        cdf = binom.cdf(window, n, max_deferral_rate)
    return int(window[0] + np.searchsorted(cdf, delta, side="right")) if window.size else 0


def _rate_threshold(margins: np.ndarray, rate: float, confidence: float, what: str,
                    every: np.ndarray | None = None) -> float:
    """[`budget_threshold`] with a confidence, on checked margins (``-inf`` allowed); the threshold keeps clear of
    ``every`` margin (by default ``margins``; all inputs' margins for a budget on one expert's share)."""
    n = margins.size
    k = binomial_order_statistic(n, rate, confidence)
    if k == 0:  # even the largest margin is not a safe threshold: (1 - b)^n > 1 - confidence
        needed = math.ceil(math.log(1.0 - confidence) / math.log1p(-rate))
        raise ValueError(f"{what} {rate!r} cannot be certified at confidence {confidence!r} with {n} calibration "
                         f"inputs: it needs at least {needed} (the smallest n with (1 - {rate!r})^n <= "
                         f"{1 - confidence:.6g}).")
    kth = np.partition(margins, n - k)[n - k]  # the k-th largest
    every = margins if every is None else every
    finite = _finite(every)
    # Every margin tied with the k-th largest stays with the classifier: at most k - 1 deferred, conservative.
    return _threshold_between(finite, every > kth) if np.isfinite(kth) else _threshold_between(finite, finite > 0)


def budget_threshold(margins: Any, max_deferral_rate: float, confidence: float | None = None,
                     weights: Any = None) -> float:
    """The deferral threshold ``t`` that keeps the deferral rate ``P(margin > t)`` within ``max_deferral_rate``.

    With ``confidence`` (in (0, 1)): with probability at least ``confidence`` over the draw of the ``N`` calibration
    inputs, the rate on new inputs from the same distribution is at most ``max_deferral_rate``. The threshold is the
    ``k``-th largest margin for the largest ``k`` with ``P(Binomial(N, b) <= k - 1) <= 1 - confidence``
    ([`binomial_order_statistic`]): exact, and as tight as an order statistic can be (the mean rate approaches the
    budget as ``N`` grows). Margins tied with that one stay with the classifier, the threshold is raised (never
    lowered) to at least ``MARGIN_TOLERANCE`` from every margin, and never below 0 (an input whose best expert is
    not estimated to beat the classifier is never deferred). When ``(1 - b)^N > 1 - confidence`` no threshold from
    these inputs can be certified: a `ValueError` names the smallest ``N`` that can.

    With ``confidence=None``: the empirical rule ([`empirical_budget_threshold`]), which holds the budget on the
    calibration inputs only (on new inputs it is exceeded about half of the time).

    Args:
        margins (array-like of `float`, shape `[N]`): the deferral margin of each calibration input; ``-inf`` for an
            input with nobody available (never deferred, counted in ``N``).
        max_deferral_rate (`float`): the budget ``b``, in (0, 1].
        confidence (`float`, *optional*): in (0, 1); `None` for the empirical rule.
        weights (array-like of `int`, *optional*): how many times each margin occurred in the sample (a cache of
            distinct margins); each occurrence counts in ``N``.

    Returns:
        `float`: the threshold (defer iff ``margin > t``).

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.evaluation.guarantees import budget_threshold
    >>> margins = np.random.default_rng(0).uniform(-1, 1, size=2_000)  # P(margin > t) = (1 - t) / 2
    >>> t = budget_threshold(margins, max_deferral_rate=0.1, confidence=0.9)
    >>> 0.8 <= t < 0.85  # the population rate (1 - t) / 2 <= 0.1, with a small margin of safety
    True

    ```
    """
    margins = _check_margins(margins)
    rate = check_share(max_deferral_rate, "max_deferral_rate")
    if weights is not None:
        counts = np.asarray(weights)
        if counts.shape != margins.shape or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
            raise ValueError(f"weights must be non-negative integers, one per margin (shape {margins.shape}), got "
                             f"{counts.dtype} of shape {counts.shape}.")
        margins = np.repeat(margins, counts)
        if margins.size == 0:
            raise ValueError("weights are all 0: no calibration input is left.")
    if confidence is None:
        return empirical_budget_threshold(margins, rate)
    return _rate_threshold(margins, rate, check_share(confidence, "confidence", closed_top=False),
                           "max_deferral_rate")


@dataclass
class DeferralGuarantee:
    """What [`certify_threshold`] certified: the threshold and, for each promise, its kind, target and bound.

    Each claim holds with probability at least its own ``confidence`` over the draw of the calibration inputs; the
    shares add up (Bonferroni) so that all hold together with probability at least ``confidence``. ``observed`` is
    the value on the calibration inputs at the threshold.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.evaluation import DeferralGuarantee, certify_threshold
    >>> margins = np.random.default_rng(0).uniform(-1, 1, size=5_000)
    >>> guarantee = certify_threshold(margins, confidence=0.9, max_deferral_rate=0.1)
    >>> isinstance(guarantee, DeferralGuarantee), guarantee.n, guarantee.confidence
    (True, 5000, 0.9)
    >>> claim = guarantee.claims[0]
    >>> claim["kind"], claim["target"], claim["observed"] <= 0.1  # stricter than the budget on these inputs
    ('deferral_rate', 0.1, True)
    >>> guarantee.to_dict()["threshold"] == guarantee.threshold  # what config.deferral_guarantee stores
    True

    ```
    """

    threshold: float
    confidence: float
    n: int
    claims: list[dict[str, Any]] = field(default_factory=list)
    assumption: str = ("new inputs are drawn independently from the same distribution as the calibration inputs "
                       "(same experts, costs and availability)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rate_constraints(margins: np.ndarray, max_deferral_rate: Any, experts: Any) -> list[tuple[dict, np.ndarray,
                                                                                                  float]]:
    """(claim, the margins that count, budget) for a total budget or one per expert."""
    if max_deferral_rate is None:
        return []
    if not isinstance(max_deferral_rate, Mapping):
        return [({"kind": "deferral_rate"}, margins, check_share(max_deferral_rate, "max_deferral_rate"))]
    if not max_deferral_rate:
        raise ValueError("max_deferral_rate is an empty dict: give a budget for at least one expert.")
    if experts is None:
        raise ValueError("a budget per expert (max_deferral_rate as a dict) needs experts=: the expert each input "
                         "would be deferred to.")
    experts = np.asarray(experts)
    if experts.shape != margins.shape:
        raise ValueError(f"experts must have one entry per margin (shape {margins.shape}), got {experts.shape}.")
    return [({"kind": "deferral_rate", "expert": name}, np.where(experts == name, margins, -np.inf),
             check_share(rate, f"max_deferral_rate[{name!r}]")) for name, rate in max_deferral_rate.items()]


def certify_threshold(
    margins: Any,
    *,
    confidence: float,
    max_deferral_rate: float | Mapping[Any, float] | None = None,
    experts: Any = None,
    max_error: float | None = None,
    loss_if_kept: Any = None,
    loss_if_deferred: Any = None,
    selective: bool = False,
    max_mean_cost: float | None = None,
    cost_if_deferred: Any = None,
    cost_bound: float | None = None,
) -> DeferralGuarantee:
    """The threshold that keeps every promise given, all together with probability at least ``confidence``.

    The ``1 - confidence`` left to chance is split equally among the promises (Bonferroni): a total budget, one per
    expert in a dict budget, the error target, the cost budget. Each promise alone:

    * **deferral budget** ``b`` (a float): ``P(margin > t) <= b``, by the binomial order statistic
      ([`budget_threshold`]); a dict ``{expert: b_j}``: ``P(margin > t and the input goes to expert j) <= b_j`` for
      each, ``experts`` giving the expert each input would go to.
    * **mean cost** ``P``: ``E[cost_if_deferred * [margin > t]] <= P``. Costs are divided by ``cost_bound`` (the
      dearest expert's price; by default the largest cost given) into [0, 1]; Learn-then-Test with MAPIE's
      Hoeffding-Bentkus p-values (exact binomial when the scaled costs are 0 or 1) tests the thresholds of the lattice
      ``LTT_GRID_STEP`` from the fewest deferrals down (the cost only grows as the threshold falls, so this is the
      risk-controlling upper bound of Bates et al. 2021) and keeps the one with the most deferrals certified.
    * **error** ``alpha``: the system loss ``loss_if_deferred`` where ``margin > t``, ``loss_if_kept`` elsewhere, has
      mean at most ``alpha`` (with ``selective=True``: the mean of ``loss_if_kept`` over the inputs kept, the
      selective risk of Geifman & El-Yaniv 2017, each test given the number kept). Learn-then-Test (Angelopoulos et
      al. 2021): one hypothesis ``risk(t) > alpha`` per lattice point, fixed before the data; p-values exact binomial
      for 0/1 losses, else MAPIE's Hoeffding-Bentkus (losses in [0, 1]); MAPIE's fixed-sequence test from ``t = 0``
      (most deferral) upwards. Every rejected hypothesis is certified; the answer is the one with the fewest
      deferrals that also meets the budgets. When none does, a `ValueError` names the smallest ``alpha`` that
      would be certified with these inputs.

    With no error target the answer defers as much as the budgets allow (the tightest certified threshold). The
    threshold is never below 0 and never closer than ``MARGIN_TOLERANCE`` to a calibration margin (only moved towards
    fewer deferrals, or among certified points).

    What the caller provides per input: the losses and costs of the expert the input would go to (the one the rule
    picks among those available); where nobody is available the margin is ``-inf`` (never deferred, counted in
    ``N``) and the deferred loss and cost may be NaN. Masked answers are the caller's: an expert without an answer
    must not be available (as [`deferral_metrics`] does).

    Args:
        margins (array-like of `float`, `[N]`): the deferral margins of the calibration inputs.
        confidence (`float`): in (0, 1).
        max_deferral_rate (`float` or `dict`, *optional*): a total budget, or one per expert name.
        experts (array-like `[N]`, *optional*): the expert each input would go to (names as in the dict).
        max_error (`float`, *optional*): the error target ``alpha``, in (0, 1].
        loss_if_kept, loss_if_deferred (array-like of `float` in [0, 1], `[N]`): each input's loss either way.
        selective (`bool`, *optional*, defaults to `False`): the error among kept inputs instead of the system error.
        max_mean_cost (`float`, *optional*): the budget on the mean cost per input.
        cost_if_deferred (array-like `[N]`): each input's cost if deferred (non-negative).
        cost_bound (`float`, *optional*): the largest cost any input can have; defaults to the largest given.

    Returns:
        [`DeferralGuarantee`]: the threshold, and the claims with their bounds and values on the calibration inputs.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.evaluation.guarantees import certify_threshold
    >>> rng = np.random.default_rng(0)
    >>> margins = rng.uniform(-1, 1, size=5_000)
    >>> experts = rng.choice(["alice", "bob"], size=5_000)
    >>> guarantee = certify_threshold(margins, confidence=0.9, max_deferral_rate={"alice": 0.05, "bob": 0.1},
    ...                               experts=experts)
    >>> [claim["expert"] for claim in guarantee.claims], guarantee.claims[0]["confidence"]
    (['alice', 'bob'], 0.95)

    ```
    """
    margins = _check_margins(margins)
    confidence = check_share(confidence, "confidence", closed_top=False)
    if not isinstance(selective, bool):
        raise ValueError(f"selective must be a bool, got {selective!r}.")
    rates = _rate_constraints(margins, max_deferral_rate, experts)
    n = margins.size
    if max_error is None and (loss_if_kept is not None or loss_if_deferred is not None):
        raise ValueError("loss_if_kept / loss_if_deferred are given without max_error: give the error target.")
    if max_error is not None:
        alpha = check_share(max_error, "max_error")
        if loss_if_kept is None or (loss_if_deferred is None and not selective):
            raise ValueError("max_error needs loss_if_kept and loss_if_deferred (selective=True: loss_if_kept only).")
        kept_loss = _check_losses("loss_if_kept", loss_if_kept, n)
        deferred_loss = (np.zeros(n) if loss_if_deferred is None else
                         _check_losses("loss_if_deferred", loss_if_deferred, n, allow_nan=np.isneginf(margins)))
    if max_mean_cost is not None:
        costs, budget, bound = _scaled_costs(margins, cost_if_deferred, max_mean_cost, cost_bound)
    trivial_cost = max_mean_cost is not None and budget >= 1  # no price can exceed it: nothing to test
    tests = len(rates) + (max_error is not None) + (max_mean_cost is not None and not trivial_cost)
    if tests == 0 and not trivial_cost:
        raise ValueError("give at least one promise: max_deferral_rate, max_error or max_mean_cost.")
    share = 1.0 - (1.0 - confidence) / max(tests, 1)
    delta = 1.0 - share
    claims: list[dict[str, Any]] = []
    low = 0.0
    for claim, counted, rate in rates:
        low = max(low, _rate_threshold(counted, rate, share, "max_deferral_rate" + (
            f"[{claim['expert']!r}]" if "expert" in claim else ""), every=margins))
        claims.append({**claim, "target": rate, "bound": RATE_BOUND, "confidence": share})
    lattice = _lattice(margins)
    clear = _clear(margins, lattice, MARGIN_TOLERANCE)
    if max_mean_cost is not None and not trivial_cost:
        binary = _is_binary(costs)
        total, _ = _above(margins, costs, lattice)
        certified = _certified(total[::-1], np.full(lattice.size, n), budget, binary, delta)  # from the top
        if certified == 0:  # even deferring nothing is not certified: (1 - budget)^n > delta
            needed = math.ceil(math.log(delta) / math.log1p(-budget))
            raise ValueError(f"max_mean_cost {max_mean_cost!r} cannot be certified at confidence {confidence!r} "
                             f"with {n} calibration inputs: it needs at least {needed}.")
        points = np.flatnonzero(clear[lattice.size - certified:]) + lattice.size - certified
        low = max(low, float(lattice[points[0]]))
        claims.append({"kind": "mean_cost", "target": float(max_mean_cost), "cost_bound": bound,
                       "bound": EXACT_LTT if binary else HB_LTT, "confidence": share})
    elif trivial_cost:
        claims.append({"kind": "mean_cost", "target": float(max_mean_cost), "cost_bound": bound,
                       "bound": "always (no input can cost more)", "confidence": 1.0})
    threshold = low
    if max_error is not None:
        threshold = _error_threshold(margins, kept_loss, deferred_loss, alpha, selective, delta, lattice, clear, low,
                                     confidence, bool(rates or max_mean_cost is not None))
        claims.append({"kind": "selective_error" if selective else "system_error", "target": alpha,
                       "bound": EXACT_LTT if _error_binary(kept_loss, deferred_loss, selective) else HB_LTT,
                       "confidence": share})
    values = {"experts": experts}
    if max_error is not None:
        values.update(kept_loss=kept_loss, deferred_loss=deferred_loss)
    if max_mean_cost is not None:
        values.update(costs=costs * bound)
    for claim in claims:
        claim["observed"] = _observed(claim, margins > threshold, values)
    return DeferralGuarantee(threshold=float(threshold), confidence=confidence, n=n, claims=claims)


def _observed(claim: dict[str, Any], deferred: np.ndarray, values: dict[str, Any]) -> float:
    """The claim's value on the calibration inputs, given which are deferred at the threshold."""
    if claim["kind"] == "deferral_rate":
        return float(deferred.mean() if "expert" not in claim else
                     (deferred & (np.asarray(values["experts"]) == claim["expert"])).mean())
    if claim["kind"] == "mean_cost":
        return float((values["costs"] * deferred).mean())
    kept, lost = values["kept_loss"], values["deferred_loss"]
    if claim["kind"] == "selective_error":
        return float(kept[~deferred].mean()) if (~deferred).any() else 0.0
    return float(np.where(deferred, lost, kept).mean())


def error_threshold(margins: Any, loss_if_kept: Any, loss_if_deferred: Any, max_error: float, confidence: float,
                    max_deferral_rate: float | Mapping[Any, float] | None = None, *, selective: bool = False,
                    experts: Any = None) -> float:
    """The threshold with the fewest deferrals whose error on new inputs is at most ``max_error`` with probability at
    least ``confidence`` (Learn-then-Test; [`certify_threshold`] says how). With ``max_deferral_rate`` too, both
    hold together: each gets half of ``1 - confidence``. With ``selective=True`` the error is the classifier's
    among the inputs it keeps (``loss_if_deferred`` is then not read and may be `None`).

    Raises a `ValueError` naming the smallest ``max_error`` that can be certified when this one cannot.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.evaluation.guarantees import error_threshold
    >>> rng = np.random.default_rng(0)
    >>> margins = rng.uniform(-1, 1, size=4_000)
    >>> kept = (rng.uniform(size=4_000) < 0.2 + 0.2 * margins).astype(float)  # the classifier errs more at high margin
    >>> deferred = (rng.uniform(size=4_000) < 0.05).astype(float)  # the expert errs 5 % of the time
    >>> t = error_threshold(margins, kept, deferred, max_error=0.15, confidence=0.9)
    >>> 0 < t < 1
    True

    ```
    """
    return certify_threshold(margins, confidence=confidence, max_deferral_rate=max_deferral_rate, experts=experts,
                             max_error=max_error, loss_if_kept=loss_if_kept, loss_if_deferred=loss_if_deferred,
                             selective=selective).threshold


__all__ = [
    "DeferralGuarantee",
    "MARGIN_TOLERANCE",
    "binomial_order_statistic",
    "budget_threshold",
    "certify_threshold",
    "empirical_budget_threshold",
    "error_threshold",
]
