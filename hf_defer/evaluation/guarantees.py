"""Deferral thresholds that keep a promise on new inputs with a stated confidence (finite-sample, distribution-free).

Every function here works on per-input arrays of a calibration sample: the deferral margin of each input (the pipeline
defers iff ``margin > t``; ``-inf`` where nobody is available, never deferred and still counted), and, for the error
and cost targets, what each input would lose if kept or if deferred. The one assumption: the calibration inputs and
the new ones are independent draws from the same distribution. "With confidence 0.9" means: over the draw of the
calibration sample, the promise holds on the population in at least 90 % of draws.

* A deferral budget ([`budget_threshold`]): the exact binomial bound on the population quantile of the margin.
* An error target ([`error_threshold`]), the system error or the selective error: Learn-then-Test (Angelopoulos et
  al. 2021) with fixed-sequence testing over a fixed lattice of thresholds, from most deferral up and from no
  deferral down (the level split between the two); with unlabelled inputs too, prediction-powered (Angelopoulos et
  al. 2023, inside Learn-then-Test as in Einbinder et al. 2024): the model's own predicted losses on them, corrected
  on the labelled ones.
* A mean-cost budget, per-expert budgets and all of these together: [`certify_threshold`], one confidence shared
  by a Bonferroni split.
* The other kind of promise, ``guarantee="expected"``: the system error's *expectation* over calibration draws and new
  inputs at most the target, by conformal risk control (Angelopoulos et al. 2024) on losses made monotone below a
  deferral cap fixed without the labels ([`certify_threshold`] says how, with the proof).

The p-values and the fixed-sequence test for bounded losses come from MAPIE's `risk_control` (`pip install
hf-defer[guarantees]`); scipy's binomial law gives the exact bounds for 0/1 losses and deferral counts.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..modeling.guarantee_record import DeferralGuarantee
from ..modeling.validators import check_share, is_number


# Learn-then-Test over deferral thresholds (Angelopoulos, Bates, Candes, Jordan, Lei 2021): the lattice of thresholds
# tested, the p-values and the fixed-sequence test, for certify_threshold.

LTT_GRID_STEP = 1e-4
"""The thresholds Learn-then-Test tests: ``0, 1e-4, 2e-4, ...`` (margins are differences of probabilities), fixed
before the data are seen, as fixed-sequence testing needs; up to the first one above every calibration margin."""

PPI_GRID_STEP = 1e-3
"""The thresholds the prediction-powered test tests (up to the first above every labelled and unlabelled margin):
coarser, as each costs a pass over the labelled inputs."""

EXACT_LTT = "Learn-then-Test, fixed-sequence, exact binomial p-values"
HB_LTT = "Learn-then-Test, fixed-sequence, Hoeffding-Bentkus p-values"
BOTH_ENDS = "Learn-then-Test, fixed-sequence from both ends"
PPI_LTT = ("Learn-then-Test, fixed-sequence from both ends, prediction-powered (each labelled input paired with "
           "{b} of the {n} unlabelled inputs, the model's predicted losses weighted as PPI++ by the labelled inputs "
           "before it; a betting test)")

TOP_DOWN_SHARE = 0.02
"""The error target is tested by two fixed sequences over the lattice, their levels adding up to the test's (a
Bonferroni split, as Learn-then-Test allows): from ``t = 0`` (most deferral) upwards with ``1 - TOP_DOWN_SHARE`` of
it, and from the top (no deferral) downwards with ``TOP_DOWN_SHARE``. The first finds the fewest deferrals that keep
the target where deferring helps; the second reaches "defer little or nothing" where the experts are worse than the
classifier (issue 42), which the first, stopping at its first failure, never tests. A small share: "defer nothing"
is either far inside the target (the experts always wrong of issue 42: p = 3.9e-4) or not worth testing, while the
first sequence's level sets the cost of every certificate (with 0.1 of the level on the second, HateSpeech at
n = 1,000 refused 20.5 % of 200 draws instead of 17 %; with 0.02, the same 17 %)."""

GUARANTEES = ("high_probability", "expected")
"""The kinds of promise: ``"high_probability"`` (with a ``confidence``: the promise holds on new inputs with that
probability over the draw of the calibration inputs) and ``"expected"`` (no confidence: the error on new inputs is at
most the target *on average* over calibration draws, a refused calibration counting as no error)."""

CRC_EXPECTED = ("conformal risk control (expected error over calibration draws and new inputs), the thresholds "
                "deferring at most as much as {cap}, each input's loss made monotone above it")
"""The bound of an expected-error claim; ``{cap}`` names the deferral cap and where it came from."""

CAP_FACTOR = 1.5
"""With unlabelled inputs, the expected-error rule may defer at most this many times the share of them that the model's
own estimates would defer to meet the target ([`_deferral_cap`]). The cap costs no validity whatever it is (it is
fixed without the labelled inputs); it sets the price: every input between the cap and the threshold counts the worse
of its two losses. 1.5 on HateSpeech at n = 1,000 (results/guarantees.md): 1.5 % of the draws refused, 1.48 times
the oracle's deferral (1: 14.5 %, 1.10 times; 2: 0 %, 1.79 times; no cap: 2.5 %, 2.77 times)."""

CRC_BOUND = 1.0
"""``B`` of conformal risk control: the largest loss a new input can have (losses lie in [0, 1])."""

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


def _lattice(margins: np.ndarray, step: float = LTT_GRID_STEP) -> np.ndarray:
    """``0, step, 2 step, ...`` up to the first point clear above every finite margin (at least ``MARGIN_TOLERANCE``,
    scaled as in [`_clear`], above the largest; beyond it every point decides alike on these inputs), and at least
    ``0, step``."""
    finite = margins[np.isfinite(margins)]
    top = float(finite.max()) if finite.size else 0.0
    top += MARGIN_TOLERANCE * max(1.0, top)
    last = max(1, math.ceil(top / step))
    while last * step < top:  # the division rounds either way
        last += 1
    while last > 1 and (last - 1) * step >= top:
        last -= 1
    return np.arange(last + 1) * step


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


def _both_ends(up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """Which lattice points are certified by the two fixed sequences: ``up`` (the rejections at the first level) read
    from ``t = 0`` (most deferral) upwards, ``down`` (at the second level) from the top (no deferral) downwards, each
    stopping at its first hypothesis not rejected."""
    certified = np.zeros(up.shape, dtype=bool)
    certified[:_fixed_sequence(~up, 0.5)] = True
    certified[up.size - _fixed_sequence(~down[::-1], 0.5):] = True
    return certified


def _error_threshold(margins: np.ndarray, test: Any, alpha: float, what: str, delta: float, lattice: np.ndarray,
                     clear: np.ndarray, low: float, confidence: float, budgets: bool) -> float:
    """Learn-then-Test over the lattice, two fixed sequences with the level split (``TOP_DOWN_SHARE``): the certified,
    clear point with the fewest deferrals at or above ``low``. ``test(alpha, level)`` says which hypotheses
    ``risk(t) > alpha`` are rejected at ``level`` (``test(alpha, level, points)``: among ``lattice[points]``)."""
    levels = ((1.0 - TOP_DOWN_SHARE) * delta, TOP_DOWN_SHARE * delta)
    reach = np.flatnonzero(clear & (lattice >= low))

    def certified(target: float) -> np.ndarray:
        return _both_ends(test(target, levels[0]), test(target, levels[1]))

    usable = reach[certified(alpha)[reach]]
    if usable.size:
        return float(lattice[usable[-1]])
    first, last = (int(reach[0]), int(reach[-1])) if reach.size else (lattice.size - 1, lattice.size - 1)

    def reaches(target: float) -> bool:  # a point of `reach` is certified: all before it on one of the sequences
        return bool(test(target, levels[0], slice(0, first + 1)).all() or
                    test(target, levels[1], slice(last, None)).all())

    smallest = _smallest_target(reaches)
    raise ValueError(
        f"max_error {alpha!r} ({what}) cannot be certified at confidence {confidence!r} with {margins.size} "
        f"calibration inputs{' and these budgets' if budgets else ''}: the smallest max_error certified here is "
        f"{smallest:.4g}" + (" (none below 1: more calibration inputs are needed)" if smallest >= 1 else "") + ".")


def _smallest_target(reaches: Any) -> float:
    """The smallest target (rounded up to 4 digits) at which ``reaches(target)`` holds: a bisection (the tests reject
    more as the target rises), then checked, and raised a step at a time where a rounding leaves it short; 1 when
    none below 1 does."""
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if reaches(middle):
            high = middle
        else:
            low = middle
    smallest = math.ceil(high * 1e4) / 1e4
    while smallest < 1 and not reaches(smallest):
        smallest = min(1.0, smallest + 1e-4)
    return smallest


def _betting_rejects(z: np.ndarray, null: np.ndarray, level: float) -> np.ndarray:
    """Per row of ``z`` (``[R, n]``: values in [-1, 2] in the inputs' own order), whether the betting test rejects
    ``mean(z) >= null`` (the row's entry) at ``level``: the capital ``prod_i (1 + l_i (null - z_i))`` reaches
    ``1 / level`` (Ville's inequality: under the null it is a non-negative supermartingale). The bets ``l_i`` are
    predictable (from ``z_1 .. z_{i-1}``: ``sqrt(2 log(1 / level) / (n s^2))`` with the running variance ``s^2``, the
    plug-in bets of Waudby-Smith & Ramdas, 2024) and at most 1/2, so no factor is negative (``null >= 0``) and the
    capital only grows with ``null``."""
    n = z.shape[1]
    steps = np.arange(1, n + 1)
    means = np.cumsum(z, axis=1) / (steps + 1)  # running means with a prior of 0, weight 1
    variances = (0.25 + np.cumsum((z - means) ** 2, axis=1)) / (steps + 1)
    before = np.hstack([np.full((z.shape[0], 1), 0.25), variances[:, :-1]])  # predictable: up to the one before
    bets = np.minimum(np.sqrt(2.0 * math.log(1.0 / level) / (n * before)), 0.5)
    capital = np.cumsum(np.log1p(bets * (null[:, None] - z)), axis=1)
    return capital.max(axis=1) >= math.log(1.0 / level)


def _ppi_test(margins: np.ndarray, kept_loss: np.ndarray, deferred_loss: np.ndarray, predicted: tuple,
              unlabeled: tuple, lattice: np.ndarray, selective: bool) -> Any:
    """``test(alpha, level)`` for prediction-powered Learn-then-Test (Angelopoulos et al. 2023, with the power-tuned
    weight of PPI++, inside Learn-then-Test as in Einbinder et al. 2024). At a threshold ``t`` the loss is ``L_t``
    (the expert's where deferred, the classifier's elsewhere; for the selective risk the deferred inputs count
    ``alpha``: ``E[loss_if_kept; kept] <= alpha P(kept)`` iff ``E[L_t] <= alpha``) and the model predicts it,
    ``f_t``, in [0, 1]. The ``U`` unlabelled inputs are dealt, in their order, into ``n`` blocks of ``B = U // n``
    (the rest unused), one per labelled input, and each labelled input ``i`` gives
    ``w_i = L_i - lambda_i f_i + lambda_i mean(f_t over block i)``: whatever ``lambda_i``, its mean is ``E[L_t]``
    when ``lambda_i`` depends only on the inputs before ``i``. ``lambda_i`` is the running ``Cov(L, f) / Var(f)``
    of the labelled inputs before ``i`` (PPI++'s weight; 1 for the first), clipped into [0, 1]: about 1 where the
    estimates are calibrated, about 0 where they carry nothing (the test is then the betting test on the labelled
    losses alone). One betting test ([`_betting_rejects`]) on the ``w_i`` (in [-1, 2]) at the whole level: the
    unlabelled mean's noise enters as ``lambda^2 Var(f) / B`` added to ``Var(L - lambda f)``, not as a second bound.
    Valid whatever the predictions are worth: poor ones widen the test, never bias it."""
    predicted_kept, predicted_deferred = predicted
    u_margins, u_kept, u_deferred = unlabeled
    n = margins.size
    size = u_margins.size // n  # B: unlabelled inputs per labelled one
    u_margins, u_kept, u_deferred = (values[: n * size] for values in (u_margins, u_kept, u_deferred))
    rows = max(1, 2_000_000 // max(n * size, 1))  # lattice points per pass: [rows, n B] at most 2e6 values
    blocks: list[np.ndarray] = []  # per lattice point and block: the kept sum, the deferred sum, the deferred count

    def block_sums() -> np.ndarray:
        if not blocks:
            out = np.empty((3, lattice.size, n))
            for start in range(0, lattice.size, rows):
                chosen = lattice[start:start + rows]
                deferred = (u_margins[None, :] > chosen[:, None]).reshape(chosen.size, n, size)
                out[0, start:start + rows] = np.where(deferred, 0.0, u_kept.reshape(n, size)).sum(axis=2)
                out[1, start:start + rows] = np.where(deferred, u_deferred.reshape(n, size), 0.0).sum(axis=2)
                out[2, start:start + rows] = deferred.sum(axis=2)
            blocks.append(out)
        return blocks[0]

    def test(alpha: float, level: float, points: slice = slice(None)) -> np.ndarray:
        chosen, sums = lattice[points], block_sums()[:, points]
        rejected = np.zeros(chosen.size, dtype=bool)
        steps = np.arange(1, n + 1)
        for start in range(0, chosen.size, rows):
            part = slice(start, start + rows)
            deferred = margins[None, :] > chosen[part, None]
            loss = np.where(deferred, alpha if selective else deferred_loss[None, :], kept_loss[None, :])
            guess = np.where(deferred, alpha if selective else predicted_deferred[None, :], predicted_kept[None, :])
            other = (sums[0, part] + (alpha * sums[2, part] if selective else sums[1, part])) / size
            mean_l, mean_f = np.cumsum(loss, axis=1) / steps, np.cumsum(guess, axis=1) / steps
            covariance = np.cumsum(loss * guess, axis=1) / steps - mean_l * mean_f
            variance = np.cumsum(guess * guess, axis=1) / steps - mean_f ** 2
            weight = np.clip(np.divide(covariance, variance, out=np.ones_like(variance), where=variance > 1e-12),
                             0.0, 1.0)
            weight = np.hstack([np.ones((weight.shape[0], 1)), weight[:, :-1]])  # predictable: the inputs before
            rejected[part] = _betting_rejects(loss - weight * (guess - other), np.full(weight.shape[0], alpha), level)
        return rejected

    return test


def _deferral_cap(unlabeled: tuple | None, alpha: float) -> tuple[float, str]:
    """The most deferral an expected-error threshold may use, ``t_u``, and how it was chosen, from no labelled input.
    On the unlabelled inputs, the model's *predicted* system error at each point of the lattice (``LTT_GRID_STEP``;
    its predicted loss if kept below the threshold, if deferred above it) names the model's own answer, the least
    deferral predicted within ``alpha``; the cap is the most deferring point whose share of unlabelled inputs
    deferred is at most ``CAP_FACTOR`` times that answer's. Where no point is predicted within ``alpha``, the point
    of least predicted error (the first of ties). Without unlabelled inputs, 0 (the pipeline's most deferral)."""
    if unlabeled is None:
        return 0.0, "threshold 0 (the most deferral)"
    u_margins, u_kept, u_deferred = unlabeled
    lattice = _lattice(u_margins)
    change, _ = _above(u_margins, u_deferred - u_kept, lattice)
    predicted = (u_kept.sum() + change) / u_margins.size
    within = np.flatnonzero(predicted <= alpha)
    if not within.size:
        cap = float(lattice[int(np.argmin(predicted))])
        return cap, (f"threshold {cap:.4g}, where the model's predicted system error on the {u_margins.size} "
                     "unlabelled inputs is least")
    _, deferred = _above(u_margins, np.zeros(u_margins.size), lattice)  # non-increasing along the lattice
    cap = float(lattice[int(np.flatnonzero(deferred <= CAP_FACTOR * deferred[within[-1]])[0])])
    return cap, (f"threshold {cap:.4g}, deferring {CAP_FACTOR:g} times the share of the {u_margins.size} unlabelled "
                 "inputs that the model's own predicted errors defer to meet the target")


def _expected_error_threshold(margins: np.ndarray, kept_loss: np.ndarray, deferred_loss: np.ndarray, alpha: float,
                              cap: float) -> float:
    """Conformal risk control on the capped monotone losses ([`certify_threshold`], ``guarantee="expected"``): the
    point of ``{cap} U {k LTT_GRID_STEP > cap}`` with the fewest deferrals, clear of every margin, where
    ``(sum_i L^u_i(t) + CRC_BOUND) / (n + 1) <= alpha``; a `ValueError` naming the smallest target when none is."""
    n = margins.size
    worst = np.where(margins > cap, np.maximum(kept_loss, deferred_loss), kept_loss)  # L^u_i(t) of an input kept at t
    lattice = _lattice(margins)
    points = np.append(cap, lattice[lattice > cap])
    above, _ = _above(margins, worst - deferred_loss, points)  # deferred at t: its deferred loss instead
    risk = (worst.sum() - above + CRC_BOUND) / (n + 1)  # non-decreasing in t
    clear = _clear(margins, points, MARGIN_TOLERANCE)
    usable = np.flatnonzero((risk <= alpha) & clear)
    if usable.size:
        return float(points[usable[-1]])
    smallest = min(1.0, math.ceil(float(risk[clear].min(initial=1.0)) * 1e4) / 1e4)
    raise ValueError(f"max_error {alpha!r} (system error, expected) cannot be promised with {n} calibration inputs: "
                     f"the smallest max_error promised here is {smallest:.4g}"
                     + (" (none below 1: more calibration inputs are needed)" if smallest >= 1 else "") + ".")


def _p_value_test(total: np.ndarray, n_obs: np.ndarray, binary: bool) -> Any:
    """``test(alpha, level)``: the hypotheses whose p-value ([`_p_values`]) is at most ``level`` (the p-values of the
    last target asked are kept: the two sequences ask the same one at two levels)."""
    last: dict[float, np.ndarray] = {}

    def test(alpha: float, level: float, points: slice = slice(None)) -> np.ndarray:
        if alpha not in last:
            last.clear()
            last[alpha] = _p_values(total, n_obs, alpha, binary)
        return last[alpha][points] <= level

    return test


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
    confidence: float | None = None,
    max_deferral_rate: float | Mapping[Any, float] | None = None,
    experts: Any = None,
    max_error: float | None = None,
    loss_if_kept: Any = None,
    loss_if_deferred: Any = None,
    selective: bool = False,
    max_mean_cost: float | None = None,
    cost_if_deferred: Any = None,
    cost_bound: float | None = None,
    predicted_if_kept: Any = None,
    predicted_if_deferred: Any = None,
    unlabeled: Mapping[str, Any] | None = None,
    guarantee: str = "high_probability",
) -> DeferralGuarantee:
    """The threshold that keeps every promise given, all together with probability at least ``confidence``; or, with
    ``guarantee="expected"``, an error target kept on average over calibration draws (the last item below).

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
      for 0/1 losses, else MAPIE's Hoeffding-Bentkus (losses in [0, 1]); two fixed-sequence tests, from ``t = 0``
      (most deferral) upwards at ``1 - TOP_DOWN_SHARE`` of the level and from the top (no deferral) downwards at
      ``TOP_DOWN_SHARE`` of it, so that "defer nothing" is reached where the experts are worse than the classifier.
      Every rejected hypothesis is certified; the answer is the one with the fewest deferrals that also meets the
      budgets. When none does, a `ValueError` names the smallest ``alpha`` that would be certified with these
      inputs (checked: calibrating at that target succeeds).
    * **error, prediction-powered** (``unlabeled`` given, at least as many as the labelled inputs): the same
      hypotheses and sequences, each tested on ``E[L_t] = E[L_t - lambda f_t] + lambda E[f_t]``, ``f_t`` the model's
      predicted loss (``predicted_if_kept`` where it answers, ``predicted_if_deferred`` where it defers, on a
      lattice of step ``PPI_GRID_STEP``): each labelled input is paired with its own ``U // n`` unlabelled ones, whose
      mean predicted loss stands for ``E[f_t]``, and ``lambda`` (PPI++'s weight) is learnt from the labelled inputs
      before it; one betting test on the pairs, whose width follows the variance of ``L - lambda f`` (plus the
      unlabelled mean's, divided by ``U // n``): small where the predictions are sharp and calibrated. Valid
      whatever the predictions are worth; with predictions that carry nothing it is the betting test on the labelled
      losses alone, which is wider than the exact binomial one: cheaper than Learn-then-Test only where the
      predictions explain much of the loss.
    * **error, expected** (``guarantee="expected"``, ``max_error`` alone, no ``confidence``): conformal risk control
      (Angelopoulos et al., ICLR 2024). The promise: ``E[err(t_hat) 1{certified}] <= alpha``, the expectation over
      the draw of the calibration inputs and the new input, ``err(t)`` the system error on new inputs at ``t``; that
      is, averaged over calibration draws and inputs, with a refused calibration counting as no error. It says
      nothing about any one calibration (one threshold may well exceed ``alpha``; the high-probability promise is the
      one that bounds that). How: a cap ``t_u``, the most deferral allowed, is fixed without the labelled inputs (on
      ``unlabeled``: ``CAP_FACTOR`` times the share the model's own predicted errors would defer to meet ``alpha``;
      else 0, the most deferral). For ``t >= t_u``
      each input's loss is made monotone: ``L^u_i(t) = max over t' in [t_u, t] of L_i(t')``, ``L_i(t')`` its true
      loss at ``t'`` (``loss_if_deferred`` if ``margin_i > t'``, else ``loss_if_kept``). So ``L^u_i(t)`` is the
      deferred loss where ``margin_i > t``, ``max(loss_if_kept, loss_if_deferred)`` where ``t_u < margin_i <= t``,
      and the kept loss where ``margin_i <= t_u``: at least the true loss, at most 1, and non-decreasing in ``t``
      (the range of the max only grows). The answer ``t_hat`` is the point of the fixed set ``Lambda = {t_u} U {k
      LTT_GRID_STEP > t_u}`` with the fewest deferrals, clear of every margin, where ``(sum_i L^u_i(t) + 1) / (n + 1)
      <= alpha``; a `ValueError` (naming the smallest target) when there is none. Proof: add the new input as the
      ``(n + 1)``-th and let ``t'`` be the largest point of ``Lambda`` (``+inf`` allowed) with
      ``sum_{i <= n + 1} L^u_i(t') / (n + 1) <= alpha`` (it exists where ``t_hat`` does, and ``t' >= t_hat``: the
      new loss is at most 1). ``t'`` is a symmetric function of the ``n + 1`` exchangeable inputs (``t_u`` and
      ``Lambda`` do not depend on them), so ``E[L^u_{n+1}(t') 1{t' exists}] = E[mean_i L^u_i(t') 1{t' exists}] <=
      alpha``; monotonicity gives ``L^u_{n+1}(t_hat) <= L^u_{n+1}(t')``, and the true loss is at most ``L^u``. The
      cap is what makes the monotone loss affordable: only inputs with ``t_u < margin <= t_hat`` pay for both sides,
      where the unrestricted one (``t_u = 0``) makes every input above 0 pay for it.

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
        predicted_if_kept, predicted_if_deferred (array-like of `float` in [0, 1], `[N]`, *optional*): the model's
            prediction of each labelled input's loss either way (e.g. ``1 -`` its probability of its answer, ``1 -``
            the chosen expert's estimated accuracy), for the prediction-powered test.
        unlabeled (`dict`, *optional*): inputs from the same distribution without labels: ``{"margins": [U],
            "predicted_if_kept": [U], "predicted_if_deferred": [U]}`` (the last not needed with ``selective``);
            with ``max_error`` it makes the error test prediction-powered (with ``guarantee="expected"``: it sets the
            deferral cap, and the labelled inputs' predicted losses are not read).
        guarantee (`str`, *optional*, defaults to ``"high_probability"``): ``"expected"`` for the expected-error
            promise (``max_error`` alone, ``confidence`` left out).

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
    if not isinstance(selective, bool):
        raise ValueError(f"selective must be a bool, got {selective!r}.")
    if check_guarantee(guarantee, confidence, max_error, selective, max_deferral_rate, max_mean_cost) == "expected":
        return _certify_expected(margins, max_error, loss_if_kept, loss_if_deferred, unlabeled,
                                 predicted_if_kept is not None or predicted_if_deferred is not None)
    confidence = check_share(confidence, "confidence", closed_top=False)
    rates = _rate_constraints(margins, max_deferral_rate, experts)
    error = _check_error_target(margins, max_error, loss_if_kept, loss_if_deferred, selective)
    predictions = _check_predictions(margins, predicted_if_kept, predicted_if_deferred, unlabeled, max_error, selective)
    cost = None if max_mean_cost is None else _scaled_costs(margins, cost_if_deferred, max_mean_cost, cost_bound)
    trivial_cost = cost is not None and cost[1] >= 1  # no price can exceed it: nothing to test
    tests = len(rates) + (error is not None) + (cost is not None and not trivial_cost)
    if tests == 0 and not trivial_cost:
        raise ValueError("give at least one promise: max_deferral_rate, max_error or max_mean_cost.")
    share = 1.0 - (1.0 - confidence) / max(tests, 1)  # Bonferroni: each promise's own confidence
    low, claims = _certify_rates(margins, rates, share)
    lattice = _lattice(margins)
    clear = _clear(margins, lattice, MARGIN_TOLERANCE)
    if cost is not None:
        cost_low, claim = _certify_cost(margins, cost, max_mean_cost, trivial_cost, lattice, clear, confidence, share)
        low, claims = max(low, cost_low), claims + [claim]
    threshold = low
    if error is not None:
        threshold, claim = _certify_error(margins, error, selective, predictions, lattice, clear, low, confidence,
                                          share, bool(rates or cost is not None))
        claims.append(claim)
    _add_observed(claims, margins > threshold, experts, error, cost)
    return DeferralGuarantee(threshold=float(threshold), confidence=confidence, n=margins.size, claims=claims)


def check_guarantee(guarantee: Any, confidence: Any, max_error: Any, selective: bool, max_deferral_rate: Any,
                    max_mean_cost: Any) -> str:
    """The kind of promise asked (one of `GUARANTEES`), refused where the other arguments make no sense with it:
    an expected-error promise bounds ``max_error`` alone (the system error) and has no confidence; a high-probability
    one needs a confidence."""
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee must be one of {list(GUARANTEES)}, got {guarantee!r}.")
    if guarantee == "high_probability":
        if confidence is None:
            raise ValueError("confidence is missing: a high-probability promise holds with a stated probability, in "
                             "(0, 1), e.g. 0.9 (or guarantee='expected' for the expected-error promise).")
        return guarantee
    if confidence is not None:
        raise ValueError(f"guarantee='expected' bounds the error on average over calibration draws and has no "
                         f"confidence; got confidence={confidence!r}: leave it out, or use "
                         "guarantee='high_probability' for a promise with that probability.")
    if max_deferral_rate is not None or max_mean_cost is not None:
        raise ValueError("guarantee='expected' takes max_error alone: a deferral budget (max_deferral_rate) or a cost "
                         "budget (max_mean_cost) is a high-probability promise; calibrate them with a confidence "
                         "(guarantee='high_probability').")
    if max_error is None:
        raise ValueError("guarantee='expected' promises a system error: give max_error.")
    if selective:
        raise ValueError("guarantee='expected' bounds the system error; the selective error (a ratio among the inputs "
                         "kept) has no expected-error promise here: use guarantee='high_probability' with a "
                         "confidence.")
    return guarantee


def _certify_expected(margins: np.ndarray, max_error: Any, loss_if_kept: Any, loss_if_deferred: Any,
                      unlabeled: Mapping[str, Any] | None, predictions: bool) -> DeferralGuarantee:
    """The expected-error promise ([`certify_threshold`], ``guarantee="expected"``) and its record (no confidence)."""
    if predictions:
        raise ValueError("predicted_if_kept / predicted_if_deferred serve the prediction-powered test "
                         "(guarantee='high_probability'); guarantee='expected' reads only the unlabelled inputs' "
                         "predicted losses, for its deferral cap: leave them out.")
    alpha, kept_loss, deferred_loss = _check_error_target(margins, max_error, loss_if_kept, loss_if_deferred, False)
    cap, where = _deferral_cap(None if unlabeled is None else _check_unlabeled(unlabeled, False), alpha)
    threshold = _expected_error_threshold(margins, kept_loss, deferred_loss, alpha, cap)
    claim = {"kind": "system_error", "target": alpha, "bound": CRC_EXPECTED.format(cap=where),
             "confidence": None, "guarantee": "expected", "method": "conformal_risk_control", "cap": cap}
    claims = [claim | ({} if unlabeled is None else {"unlabeled": int(np.asarray(unlabeled["margins"]).size)})]
    _add_observed(claims, margins > threshold, None, (alpha, kept_loss, deferred_loss), None)
    return DeferralGuarantee(threshold=threshold, confidence=None, n=margins.size, claims=claims)


def _check_error_target(margins: np.ndarray, max_error: Any, loss_if_kept: Any, loss_if_deferred: Any,
                        selective: bool) -> tuple[float, np.ndarray, np.ndarray] | None:
    """The error target and the checked losses ``(alpha, kept_loss, deferred_loss)``; `None` without a target."""
    n = margins.size
    if max_error is None and (loss_if_kept is not None or loss_if_deferred is not None):
        raise ValueError("loss_if_kept / loss_if_deferred are given without max_error: give the error target.")
    if max_error is None:
        return None
    alpha = check_share(max_error, "max_error")
    if loss_if_kept is None or (loss_if_deferred is None and not selective):
        raise ValueError("max_error needs loss_if_kept and loss_if_deferred (selective=True: loss_if_kept only).")
    kept_loss = _check_losses("loss_if_kept", loss_if_kept, n)
    deferred_loss = (np.zeros(n) if loss_if_deferred is None else
                     _check_losses("loss_if_deferred", loss_if_deferred, n, allow_nan=np.isneginf(margins)))
    return alpha, kept_loss, deferred_loss


def _certify_rates(margins: np.ndarray, rates: list[tuple[dict, np.ndarray, float]],
                   share: float) -> tuple[float, list[dict[str, Any]]]:
    """The deferral budgets: the lowest threshold meeting them all, and their claims."""
    low, claims = 0.0, []
    for claim, counted, rate in rates:
        low = max(low, _rate_threshold(counted, rate, share, "max_deferral_rate" + (
            f"[{claim['expert']!r}]" if "expert" in claim else ""), every=margins))
        claims.append({**claim, "target": rate, "bound": RATE_BOUND, "confidence": share})
    return low, claims


def _certify_cost(margins: np.ndarray, cost: tuple[np.ndarray, float, float], max_mean_cost: float, trivial: bool,
                  lattice: np.ndarray, clear: np.ndarray, confidence: float,
                  share: float) -> tuple[float, dict[str, Any]]:
    """The mean-cost budget: the lowest threshold of the lattice it certifies (tested from the top: the cost only
    grows as the threshold falls), and its claim."""
    costs, budget, bound = cost
    if trivial:
        return 0.0, {"kind": "mean_cost", "target": float(max_mean_cost), "cost_bound": bound,
                     "bound": "always (no input can cost more)", "confidence": 1.0}
    n, delta = margins.size, 1.0 - share
    binary = _is_binary(costs)
    total, _ = _above(margins, costs, lattice)
    certified = _certified(total[::-1], np.full(lattice.size, n), budget, binary, delta)  # from the top
    if certified == 0:  # even deferring nothing is not certified: (1 - budget)^n > delta
        needed = math.ceil(math.log(delta) / math.log1p(-budget))
        raise ValueError(f"max_mean_cost {max_mean_cost!r} cannot be certified at confidence {confidence!r} "
                         f"with {n} calibration inputs: it needs at least {needed}.")
    points = np.flatnonzero(clear[lattice.size - certified:]) + lattice.size - certified
    return float(lattice[points[0]]), {"kind": "mean_cost", "target": float(max_mean_cost), "cost_bound": bound,
                                       "bound": EXACT_LTT if binary else HB_LTT, "confidence": share}


def _certify_error(margins: np.ndarray, error: tuple[float, np.ndarray, np.ndarray], selective: bool,
                   predictions: tuple | None, lattice: np.ndarray, clear: np.ndarray, low: float, confidence: float,
                   share: float, constrained: bool) -> tuple[float, dict[str, Any]]:
    """The error target: the threshold with the fewest deferrals Learn-then-Test certifies at or above ``low``
    (prediction-powered with unlabelled inputs), and its claim."""
    alpha, kept_loss, deferred_loss = error
    binary = _error_binary(kept_loss, deferred_loss, selective)
    if predictions is None:
        test = _p_value_test(*_error_sums(margins, kept_loss, deferred_loss, selective, lattice), binary)
        points, bound = (lattice, clear), f"{BOTH_ENDS}, {'exact binomial' if binary else 'Hoeffding-Bentkus'} p-values"
    else:
        every = np.concatenate([margins, predictions[2][0]])
        points = (_lattice(every, PPI_GRID_STEP),)
        points += (_clear(margins, points[0], MARGIN_TOLERANCE),)
        test = _ppi_test(margins, kept_loss, deferred_loss, predictions[:2], predictions[2], points[0], selective)
        bound = PPI_LTT.format(n=predictions[2][0].size, b=predictions[2][0].size // margins.size)
    threshold = _error_threshold(margins, test, alpha, "selective error" if selective else "system error",
                                 1.0 - share, *points, low, confidence, constrained)
    claim = {"kind": "selective_error" if selective else "system_error", "target": alpha, "bound": bound,
             "confidence": share, "method": "learn_then_test" if predictions is None else "prediction_powered"}
    return threshold, claim | ({} if predictions is None else {"unlabeled": predictions[2][0].size})


def _add_observed(claims: list[dict[str, Any]], deferred: np.ndarray, experts: Any,
                  error: tuple | None, cost: tuple | None) -> None:
    """Each claim's value on the calibration inputs at the threshold (``observed``)."""
    values = {"experts": experts}
    if error is not None:
        values.update(kept_loss=error[1], deferred_loss=error[2])
    if cost is not None:
        values.update(costs=cost[0] * cost[2])
    for claim in claims:
        claim["observed"] = _observed(claim, deferred, values)


def _check_predictions(margins: np.ndarray, predicted_if_kept: Any, predicted_if_deferred: Any,
                       unlabeled: Mapping[str, Any] | None, max_error: Any, selective: bool) -> tuple | None:
    """The labelled inputs' predicted losses and the unlabelled inputs' (margins, predicted losses), checked; `None`
    without ``unlabeled``."""
    if unlabeled is None:
        if predicted_if_kept is not None or predicted_if_deferred is not None:
            raise ValueError("predicted_if_kept / predicted_if_deferred are given without unlabeled=: the predicted "
                             "losses serve the prediction-powered test, which needs the unlabelled inputs too.")
        return None
    if max_error is None:
        raise ValueError("unlabeled= serves the error target: give max_error (budgets need no labels at all).")
    unlabeled_checked = _check_unlabeled(unlabeled, selective)
    if unlabeled_checked[0].size < margins.size:
        raise ValueError(f"unlabeled must hold at least as many inputs as the labelled ones ({margins.size}), got "
                         f"{unlabeled_checked[0].size}: the prediction-powered test pairs each labelled input with "
                         "its own unlabelled ones.")
    if predicted_if_kept is None or (predicted_if_deferred is None and not selective):
        raise ValueError("unlabeled= needs the labelled inputs' predicted losses too: predicted_if_kept and (unless "
                         "selective) predicted_if_deferred.")
    n = margins.size
    kept = _check_losses("predicted_if_kept", predicted_if_kept, n)
    deferred = (np.zeros(n) if predicted_if_deferred is None else
                _check_losses("predicted_if_deferred", predicted_if_deferred, n, allow_nan=np.isneginf(margins)))
    return kept, deferred, unlabeled_checked


def _check_unlabeled(unlabeled: Any, selective: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unlabelled inputs' margins and predicted losses ``(margins, if kept, if deferred)``, checked."""
    if not isinstance(unlabeled, Mapping) or set(unlabeled) - {"margins", "predicted_if_kept",
                                                                "predicted_if_deferred"}:
        raise ValueError("unlabeled must be a dict with 'margins', 'predicted_if_kept' and (unless selective) "
                         f"'predicted_if_deferred', got {unlabeled!r:.200}.")
    needed = ["predicted_if_kept"] + ([] if selective else ["predicted_if_deferred"])
    if "margins" not in unlabeled or any(name not in unlabeled for name in needed):
        raise ValueError(f"unlabeled needs 'margins' and {needed}, got the keys {sorted(unlabeled)}.")
    try:
        u_margins = _check_margins(unlabeled["margins"])
    except ValueError as error:
        raise ValueError(f"unlabeled['margins']: {error}") from None
    u_kept = _check_losses("unlabeled['predicted_if_kept']", unlabeled["predicted_if_kept"], u_margins.size)
    u_deferred = (np.zeros(u_margins.size) if unlabeled.get("predicted_if_deferred") is None else
                  _check_losses("unlabeled['predicted_if_deferred']", unlabeled["predicted_if_deferred"],
                                u_margins.size, allow_nan=np.isneginf(u_margins)))
    return u_margins, u_kept, u_deferred


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
