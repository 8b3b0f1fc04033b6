"""The expected-error promise (``certify_threshold(..., guarantee="expected")``, conformal risk control on losses made
monotone below a deferral cap): the rule against a brute-force reading of its definition, hand-worked cases, bad
calls, and the promise itself, ``E[err(t_hat) 1{certified}] <= max_error``, over many calibration draws from finite
populations whose error at any threshold is exact, including populations where deferring hurts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hf_defer.evaluation.guarantees import LTT_GRID_STEP, MARGIN_TOLERANCE, certify_threshold
from hf_defer.modeling.guarantee_record import DeferralGuarantee

DRAWS = 1_000


# ---------------------------------------------------------------- the rule, read from its definition


def brute_force(margins, kept, deferred, alpha, cap):
    """The rule as the docstring states it, computed the long way: every point of {cap} U {k step > cap} up to the
    first one clear above every margin (and 0, step at least), the true loss of every input at every point, the running
    max from the cap upwards (L^u), the first n + 1 conformal condition, the least deferring clear point; None when
    none."""
    finite = margins[np.isfinite(margins)]
    tolerance = MARGIN_TOLERANCE * max(1.0, float(finite.max()) if finite.size else 0.0)
    top = max(float(finite.max()) if finite.size else 0.0, 0.0)
    grid = np.arange(int(top / LTT_GRID_STEP) + 3) * LTT_GRID_STEP
    grid = grid[: max(np.flatnonzero(grid - top >= tolerance)[0], 1) + 1]  # the first point clear above every margin
    points = np.concatenate([[cap], grid[grid > cap]])
    true_loss = np.where(margins[None, :] > points[:, None], deferred[None, :], kept[None, :])
    monotone = np.maximum.accumulate(true_loss, axis=0)
    assert (monotone >= true_loss).all() and (np.diff(monotone, axis=0) >= 0).all()
    n = margins.size
    best = None
    for point, losses in zip(points, monotone):
        clear = finite.size == 0 or np.abs(finite - point).min() >= tolerance
        if (losses.sum() + 1) / (n + 1) <= alpha and clear:
            best = point
    return best


def brute_force_cap(u_margins, u_kept, u_deferred, alpha, factor=1.5):
    """On 0, step, ... (up to the first point clear above every unlabelled margin): the model's predicted error and share
    deferred at each point; the least deferring point predicted within alpha is its answer, the cap the most deferring
    point deferring at most `factor` times the answer's share; with no point within alpha, the least predicted error
    (the first of ties)."""
    finite = u_margins[np.isfinite(u_margins)]
    tolerance = MARGIN_TOLERANCE * max(1.0, float(finite.max()) if finite.size else 0.0)
    top = max(float(finite.max()) if finite.size else 0.0, 0.0)
    grid = np.arange(int(top / LTT_GRID_STEP) + 3) * LTT_GRID_STEP
    grid = grid[: max(np.flatnonzero(grid - top >= tolerance)[0], 1) + 1]
    predicted = np.array([np.where(u_margins > t, u_deferred, u_kept).mean() for t in grid])
    share = np.array([(u_margins > t).mean() for t in grid])
    within = [i for i in range(grid.size) if predicted[i] <= alpha]
    if not within:
        return float(grid[int(np.argmin(predicted))])
    answer = within[-1]
    return float(min(t for t, d in zip(grid, share) if d <= factor * share[answer]))


margin_values = st.one_of(st.integers(-20, 100).map(lambda k: k * 0.0005), st.just(-np.inf),
                          st.floats(-0.01, 0.05, allow_nan=False))
loss_values = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1, allow_nan=False))


@given(st.data(), st.integers(1, 25), st.floats(0.02, 1.0), st.booleans())
def test_the_rule_is_its_definition(data, n, alpha, with_unlabeled):
    margins = np.array(data.draw(st.lists(margin_values, min_size=n, max_size=n)))
    kept = np.array(data.draw(st.lists(loss_values, min_size=n, max_size=n)))
    deferred = np.array(data.draw(st.lists(loss_values, min_size=n, max_size=n)))
    unlabeled, cap = None, 0.0
    if with_unlabeled:
        u = data.draw(st.integers(1, 15))
        unlabeled = {"margins": np.array(data.draw(st.lists(margin_values, min_size=u, max_size=u))),
                     "predicted_if_kept": np.array(data.draw(st.lists(loss_values, min_size=u, max_size=u))),
                     "predicted_if_deferred": np.array(data.draw(st.lists(loss_values, min_size=u, max_size=u)))}
        cap = brute_force_cap(unlabeled["margins"], unlabeled["predicted_if_kept"],
                              np.where(np.isneginf(unlabeled["margins"]), 0.0, unlabeled["predicted_if_deferred"]),
                              alpha)
    expected = brute_force(margins, kept, np.where(np.isneginf(margins), 0.0, deferred), alpha, cap)
    call = dict(max_error=alpha, loss_if_kept=kept, loss_if_deferred=deferred, guarantee="expected",
                unlabeled=unlabeled)
    if expected is None:
        with pytest.raises(ValueError, match=r"cannot be promised .* the smallest max_error promised here is"):
            certify_threshold(margins, **call)
        return
    guarantee = certify_threshold(margins, **call)
    assert guarantee.threshold == pytest.approx(expected, abs=1e-12)
    claim = guarantee.claims[0]
    assert claim["cap"] == pytest.approx(cap, abs=1e-12) and guarantee.threshold >= claim["cap"] >= 0
    assert guarantee.confidence is None and guarantee.expected


def test_hand_worked_case():
    # Four inputs: margins 0.1, 0.2, 0.3, 0.4; the classifier errs on the first two, the expert on the last.
    margins = np.array([0.1, 0.2, 0.3, 0.4])
    kept, deferred = np.array([1.0, 1.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0, 1.0])
    # Cap 0 (no unlabelled inputs). At t in [0.1, 0.2): input 1 kept, L^u = max(1, 0) = 1; inputs 2, 3 deferred
    # (0, 0); input 4 deferred (1): sum 2, (2 + 1) / 5 = 0.6. At t < 0.1: everyone deferred, sum 1, 2 / 5 = 0.4.
    # At t in [0.4, ...): inputs 1, 2 kept (1, 1), input 3 max(0, 0) = 0, input 4 max(0, 1) = 1: sum 3, 4 / 5 = 0.8,
    # although its true error is 2 / 4: the expert's error on input 4 is still counted (deferred at t = 0).
    guarantee = certify_threshold(margins, max_error=0.6, loss_if_kept=kept, loss_if_deferred=deferred,
                                  guarantee="expected")
    assert 0.1 < guarantee.threshold < 0.2  # the least deferring point with risk 0.6: [0.1, 0.2), clear of 0.1
    assert guarantee.claims[0]["observed"] == pytest.approx(0.5)  # true error: input 1 kept (1), 4 deferred (1)
    t = certify_threshold(margins, max_error=0.5, loss_if_kept=kept, loss_if_deferred=deferred,
                          guarantee="expected").threshold
    assert 0 <= t < 0.1  # 0.4 at t < 0.1
    with pytest.raises(ValueError, match=r"smallest max_error promised here is 0.4\b"):
        certify_threshold(margins, max_error=0.39, loss_if_kept=kept, loss_if_deferred=deferred, guarantee="expected")
    # The cap from unlabelled inputs, at margins 0.05, 0.15, 0.25, 0.35, each predicted 1 if kept and 0 if
    # deferred: the predicted error is the share kept. Target 0.6: the model's answer keeps two (t in
    # [0.15, 0.25)), deferring 2 / 4; 1.5 times that is 3 / 4: the cap is the first point deferring at most 3, t = 0.05
    # (margin 0.05 is not above it). Above the cap, input 1 (margin 0.1) kept counts max(1, 0) = 1 and input 4
    # deferred 1: at t in [0.1, 0.2), (2 + 1) / 5 = 0.6; below 0.1, input 1 deferred: 0.4.
    unlabeled = {"margins": np.array([0.05, 0.15, 0.25, 0.35]), "predicted_if_kept": np.ones(4),
                 "predicted_if_deferred": np.zeros(4)}
    guarantee = certify_threshold(margins, max_error=0.6, loss_if_kept=kept, loss_if_deferred=deferred,
                                  guarantee="expected", unlabeled=unlabeled)
    claim = guarantee.claims[0]
    assert claim["cap"] == pytest.approx(0.05, abs=1e-12) and 0.1 < guarantee.threshold < 0.2
    assert claim["unlabeled"] == 4 and "1.5 times the share of the 4 unlabelled inputs" in claim["bound"]
    # A target the model thinks it misses everywhere (predicted (1 + 0.9) / 2 = 0.95 deferring both, (0.95 + 0.9) / 2
    # = 0.925 keeping the input at 0.34, 0.975 keeping both; target 0.8): the cap is the point of least predicted
    # error, the first lattice point in [0.34, 0.36).
    unlabeled = {"margins": np.array([0.34, 0.36]), "predicted_if_kept": np.array([0.95, 1.0]),
                 "predicted_if_deferred": np.array([1.0, 0.9])}
    guarantee = certify_threshold(margins, max_error=0.8, loss_if_kept=kept, loss_if_deferred=deferred,
                                  guarantee="expected", unlabeled=unlabeled)
    assert 0.34 - 1e-12 <= guarantee.claims[0]["cap"] <= 0.3401 + 1e-12 and "is least" in guarantee.claims[0]["bound"]
    # Above it: at t = cap, inputs 1-3 kept (1, 1, 0) and input 4 deferred (1): (3 + 1) / 5 = 0.8; above 0.4 input 4
    # kept counts max(0, 1) = 1: 0.8 again. The least deferring point is the top one.
    assert guarantee.threshold > 0.4
    with pytest.raises(ValueError, match=r"smallest max_error promised here is 0.8\b"):
        certify_threshold(margins, max_error=0.79, loss_if_kept=kept, loss_if_deferred=deferred,
                          guarantee="expected", unlabeled=unlabeled)


@pytest.mark.parametrize("call, message", [
    (dict(confidence=0.9), r"has no confidence; got confidence=0.9"),
    (dict(max_deferral_rate=0.1), r"takes max_error alone: a deferral budget"),
    (dict(max_mean_cost=0.1, cost_if_deferred=np.ones(10)), r"takes max_error alone"),
    (dict(selective=True), r"selective error .* has no expected-error promise"),
    (dict(max_error=None, loss_if_kept=None, loss_if_deferred=None), r"promises a system error: give max_error"),
    (dict(guarantee="mean"), r"guarantee must be one of \['high_probability', 'expected'\], got 'mean'"),
    (dict(predicted_if_kept=np.zeros(10)), r"predicted_if_kept / predicted_if_deferred serve the prediction-powered"),
    (dict(unlabeled={"margins": [0.1]}), r"unlabeled needs 'margins' and \['predicted_if_kept', "
                                         r"'predicted_if_deferred'\]"),
])
def test_bad_calls_are_refused(call, message):
    margins = np.linspace(0, 1, 10)
    arguments = dict(max_error=0.3, loss_if_kept=np.zeros(10), loss_if_deferred=np.zeros(10), guarantee="expected")
    with pytest.raises(ValueError, match=message):
        certify_threshold(margins, **(arguments | call))


def test_a_high_probability_promise_still_needs_a_confidence():
    with pytest.raises(ValueError, match=r"confidence is missing: a high-probability promise"):
        certify_threshold(np.linspace(0, 1, 10), max_deferral_rate=0.5)


def test_the_record_round_trips_and_says_how_it_holds():
    margins = np.linspace(0, 1, 200)
    kept = (np.arange(200) % 4 == 0).astype(float)
    guarantee = certify_threshold(margins, max_error=0.3, loss_if_kept=kept, loss_if_deferred=np.zeros(200),
                                  guarantee="expected").recorded(["alice"], date="2026-11-28")
    again = DeferralGuarantee.from_dict(guarantee.to_dict())
    assert again == guarantee and again.expected and again.confidence is None
    assert again.claims[0]["method"] == "conformal_risk_control" and again.claims[0]["guarantee"] == "expected"
    assert again.strength_text() == "in expectation over calibration draws"


# ---------------------------------------------------------------- the promise over many calibration draws


class Population:
    """A finite population (draws are i.i.d. from it, with replacement): the system error of any threshold is exact."""

    def __init__(self, margins, kept, deferred, predicted_kept=None, predicted_deferred=None):
        order = np.argsort(margins)
        self.margins, self.kept, self.deferred = margins[order], kept[order], deferred[order]
        self.predicted = None if predicted_kept is None else (predicted_kept[order], predicted_deferred[order])
        self.prefix = np.append(0.0, np.cumsum(self.kept - self.deferred))

    def error(self, t):
        return (self.deferred.sum() + self.prefix[np.searchsorted(self.margins, t, side="right")]) / self.margins.size

    def grid_errors(self):
        t = np.arange(0, 1.0002, LTT_GRID_STEP)
        return t, self.error(t)


def population(kind, size=4_000, seed=0):
    """Margins spread over (0, 1); the classifier's and the expert's 0/1 losses drawn from probabilities that depend
    on the margin, which are also the model's (calibrated) predictions."""
    rng = np.random.default_rng(seed)
    m = (np.arange(size) + 0.5) / size
    if kind == "monotone":  # the expert never errs: deferring more never hurts, conformal risk control's own case
        p_kept, p_deferred = 0.05 + 0.4 * m, np.zeros(size)
    elif kind == "expert_errs":  # deferring helps above m = 0.25 only (the expert errs 15 % of the time)
        p_kept, p_deferred = 0.05 + 0.4 * m, np.full(size, 0.15)
    elif kind == "hurts_at_the_top":  # the classifier right and the expert wrong on the most-deferred inputs
        p_kept = np.select([m < 0.5, m < 0.9], [0.3 * np.ones(size), 0.5 * np.ones(size)], 0.0)
        p_deferred = np.select([m < 0.5, m < 0.9], [0.25 * np.ones(size), 0.05 * np.ones(size)], 0.3)
    else:  # "swaps": on most inputs exactly one of the two errs, so the error barely moves while each input's does
        p_kept = np.select([m < 0.05, m < 0.9], [0.6 * np.ones(size), 0.35 * np.ones(size)], 0.0)
        p_deferred = np.select([m < 0.05, m < 0.9], [np.zeros(size), 0.35 * np.ones(size)], 0.3)
    u = rng.uniform(size=size)
    kept = (u < p_kept).astype(float)
    if kind == "swaps":  # disjoint: the expert errs exactly where the classifier does not
        deferred = ((u >= p_kept) & (u < p_kept + p_deferred)).astype(float)
    else:
        deferred = (rng.uniform(size=size) < p_deferred).astype(float)
    return Population(m, kept, deferred, p_kept, p_deferred)


def mean_error(pop, n, alpha, unlabeled=None, draws=DRAWS, seed=1, return_deferral=False):
    """The mean over calibration draws of err(t_hat) 1{certified}, its Monte-Carlo standard error, the share
    certified (return_deferral: the mean share deferred where certified, and the share certified)."""
    rng = np.random.default_rng([seed, n])
    values, shares = np.zeros(draws), np.full(draws, np.nan)
    for r in range(draws):
        rows = rng.integers(0, pop.margins.size, n)
        try:
            t = certify_threshold(pop.margins[rows], max_error=alpha, loss_if_kept=pop.kept[rows],
                                  loss_if_deferred=pop.deferred[rows], guarantee="expected",
                                  unlabeled=unlabeled).threshold
        except ValueError:
            continue  # refused: no promise, no error counted
        values[r], shares[r] = pop.error(t), (pop.margins > t).mean()
    if return_deferral:
        return np.nanmean(shares), (~np.isnan(shares)).mean()
    return values.mean(), values.std(ddof=1) / math.sqrt(draws), (~np.isnan(shares)).mean()


def unlabeled_set(pop, how, size=2_000, seed=7):
    rows = np.random.default_rng(seed).integers(0, pop.margins.size, size)
    kept, deferred = pop.predicted
    if how == "misleading":  # the model's estimates inverted: the cap lands wherever they say, validity must hold
        kept, deferred = deferred, kept
    return {"margins": pop.margins[rows], "predicted_if_kept": kept[rows], "predicted_if_deferred": deferred[rows]}


@pytest.mark.parametrize("kind", ["monotone", "expert_errs", "hurts_at_the_top", "swaps"])
@pytest.mark.parametrize("unlabeled", [None, "calibrated", "misleading"])
@pytest.mark.parametrize("n", [50, 200])
def test_expected_error_holds(kind, unlabeled, n):
    pop = population(kind)
    _, errors = pop.grid_errors()
    alpha = float(errors.min()) + 0.02  # a little above the best error: the rule has to find the good thresholds
    mean, se, _ = mean_error(pop, n, alpha, None if unlabeled is None else unlabeled_set(pop, unlabeled))
    assert mean <= alpha + 3 * se, (kind, unlabeled, n, mean, alpha, se)


def test_the_check_can_fail_and_the_rule_is_not_loose():
    """Where losses are monotone the rule is conformal risk control itself, near-tight: its mean error is within
    a few points of the target. The plug-in rule (the fewest deferrals whose error on the draw is within the target),
    checked the same way, breaks the expectation by many standard errors: the check has the power to catch an
    invalid rule."""
    pop = population("monotone")
    t_grid, errors = pop.grid_errors()
    alpha, n = 0.2, 50
    mean, se, certified = mean_error(pop, n, alpha)
    assert alpha - 0.03 <= mean <= alpha + 3 * se and certified > 0.95
    rng = np.random.default_rng([1, n])
    plug_in = np.zeros(DRAWS)
    for r in range(DRAWS):
        rows = rng.integers(0, pop.margins.size, n)
        m, k, d = pop.margins[rows], pop.kept[rows], pop.deferred[rows]
        ok = np.flatnonzero(np.where(m[None, :] > t_grid[::10, None], d, k).mean(axis=1) <= alpha)
        plug_in[r] = errors[::10][ok[-1]] if ok.size else 0.0
    assert plug_in.mean() > alpha + 3 * plug_in.std(ddof=1) / math.sqrt(DRAWS)


def test_unlabelled_cap_helps_where_the_estimates_are_good():
    """Where deferring helps on some inputs only, a cap from calibrated estimates spares the inputs below it the
    worse of their two losses: fewer deferrals and at least as many draws certified as with the cap at 0 (same
    draws)."""
    pop = population("expert_errs")
    alpha = float(pop.grid_errors()[1].min()) + 0.02
    deferral_without, certified_without = mean_error(pop, 200, alpha, draws=300, return_deferral=True)
    deferral_with, certified_with = mean_error(pop, 200, alpha, unlabeled_set(pop, "calibrated"), draws=300,
                                               return_deferral=True)
    assert deferral_with < deferral_without and certified_with >= certified_without
