"""Learn-then-Test over deferral thresholds (Angelopoulos, Bates, Candes, Jordan, Lei 2021): the lattice of
thresholds tested, the p-values and the fixed-sequence test, for [`certify_threshold`].

MAPIE's `risk_control` gives the Hoeffding-Bentkus p-value (valid for any loss in [0, 1]: the smaller of the Hoeffding
and Bentkus tail bounds, Bates et al. 2021); scipy's binomial law the exact p-value of 0/1 losses (MAPIE's binary
p-value rounds ``n * mean`` up, which float rounding can push one count too far). The fixed-sequence test is one line
here (see [`_fixed_sequence`] for why not MAPIE's).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np

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
    if isinstance(max_mean_cost, bool) or not isinstance(max_mean_cost, Real) or not max_mean_cost > 0:
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
