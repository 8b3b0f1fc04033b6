"""Promises that hold on new inputs (issue 30): how often a deferral budget and an error target calibrated on n inputs
are broken on the population, by the empirical rule and by the guaranteed one, and what the guarantee costs.

Every data set is reduced to a [`Pool`]: per input, the deferral *margin* (the model defers iff margin > t), the
classifier's 0/1 loss and the chosen expert's 0/1 loss, all from models that never saw the input (a head trained on a
separate part, or cross-fitted). The pool is the population. [`run_draws`] draws n calibration inputs from it
(without replacement, 1,000 times), calibrates a threshold on each draw with every rule, and measures the promise

- on the whole pool, the distribution the draws come from: this is what a guarantee "with probability 1 - delta over
  the calibration draw, the rate on new inputs is at most b" speaks of, and
- on the rest of the pool (the inputs not drawn), a finite batch of new inputs: its own sampling noise adds to the
  calibration's, so a rule exactly at its confidence breaks a little more often there, about by the factor
  sqrt(N / (N - n)) on the standard deviation.

The rules ([`hf_defer.evaluation.guarantees`] for the library's):

- budget (at most b deferred): the empirical rule (`budget_threshold(confidence=None)`, keeping the floor(bn) highest
  margins, today's `calibrate_deferral`) and the guaranteed one (`confidence=1 - delta`, a binomial order statistic);
- error target (system error at most alpha, the fewest deferrals): the plug-in rule (the fewest deferrals whose error
  on the calibration draw is at most alpha) and Learn-then-Test (`error_threshold`);
- selective risk (error of the classifier on the inputs it keeps at most alpha_s, the fewest deferrals), the question
  MAPIE's `BinaryClassificationController(risk="precision")` answers: the plug-in rule, Learn-then-Test
  (`error_threshold(selective=True)`) and MAPIE (Hoeffding-Bentkus p-values, Bonferroni-Holm over its default grid of
  100 thresholds), on the same draws.

The data sets are built by the `pool_*` functions of `research.guarantees_data` (embeddings cached by
`hf_defer.experts.embed_texts`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


SIZES = (100, 300, 1000, 3000)
"""Calibration sizes n; a size is run only where the pool holds at least 2n inputs (the rest is then at least n)."""


@dataclass
class Pool:
    """Per-input margins and 0/1 losses of a data set's population (inputs no model was trained on)."""

    name: str
    margins: np.ndarray  # [N] float64: defer iff margin > t; -inf where nobody can be asked (never deferred)
    loss_if_kept: np.ndarray  # [N] 0/1: the classifier is wrong
    loss_if_deferred: np.ndarray  # [N] 0/1: the chosen expert is wrong (where nobody is available: the classifier's)
    description: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    predicted_if_kept: np.ndarray | None = None  # [N] in [0, 1]: 1 - the classifier's probability of its answer
    predicted_if_deferred: np.ndarray | None = None  # [N] in [0, 1]: 1 - the chosen expert's estimated accuracy

    def __post_init__(self) -> None:
        self.margins = np.asarray(self.margins, dtype=np.float64)
        self.loss_if_kept = np.asarray(self.loss_if_kept, dtype=np.float64)
        self.loss_if_deferred = np.asarray(self.loss_if_deferred, dtype=np.float64)
        shapes = {a.shape for a in (self.margins, self.loss_if_kept, self.loss_if_deferred)}
        if len(shapes) != 1 or self.margins.ndim != 1:
            raise ValueError(f"Pool {self.name!r}: margins and losses must be 1-d arrays of one length, got {shapes}.")
        for name in ("loss_if_kept", "loss_if_deferred"):
            if not np.isin(getattr(self, name), (0.0, 1.0)).all():
                raise ValueError(f"Pool {self.name!r}: {name} must hold 0/1 losses.")
        if np.isnan(self.margins).any() or np.isposinf(self.margins).any():
            raise ValueError(f"Pool {self.name!r}: margins must be finite or -inf (nobody available).")
        for name in ("predicted_if_kept", "predicted_if_deferred"):
            value = getattr(self, name)
            if value is not None:
                value = np.asarray(value, dtype=np.float64)
                if value.shape != self.margins.shape or not ((value >= 0) & (value <= 1)).all():
                    raise ValueError(f"Pool {self.name!r}: {name} must hold one estimate in [0, 1] per input.")
                setattr(self, name, value)


class Population:
    """Deferral rate, system error and selective risk of thresholds on a fixed population, in O(log N) per threshold
    (sorted margins and prefix sums of the losses).

    Example:

    ```python
    >>> population = Population(np.array([0.1, 0.5, 0.9]), np.array([0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0]))
    >>> rate, error, selective = population.at(np.array([0.4]))
    >>> float(rate[0]), float(error[0]), float(selective[0])  # defers 0.5 and 0.9 (expert losses 0, 1), keeps 0.1
    (0.6666666666666666, 0.3333333333333333, 0.0)

    ```
    """

    def __init__(self, margins: np.ndarray, loss_if_kept: np.ndarray, loss_if_deferred: np.ndarray) -> None:
        order = np.argsort(margins, kind="stable")
        self.size = len(margins)
        self.sorted = np.asarray(margins, dtype=np.float64)[order]
        self.kept_prefix = np.concatenate([[0.0], np.cumsum(np.asarray(loss_if_kept, dtype=np.float64)[order])])
        self.deferred_prefix = np.concatenate([[0.0], np.cumsum(np.asarray(loss_if_deferred, dtype=np.float64)[order])])

    def counts(self, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per threshold: how many inputs are kept (margin <= t), the classifier's losses on them and the experts'
        losses on the deferred ones."""
        kept = np.searchsorted(self.sorted, np.asarray(thresholds, dtype=np.float64), side="right")
        return kept, self.kept_prefix[kept], self.deferred_prefix[-1] - self.deferred_prefix[kept]

    def at(self, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Deferral rate, system error and selective risk (NaN where nothing is kept) at each threshold."""
        kept, kept_loss, deferred_loss = self.counts(thresholds)
        with np.errstate(invalid="ignore", divide="ignore"):
            selective = np.where(kept > 0, kept_loss / np.maximum(kept, 1), np.nan)
        return (self.size - kept) / self.size, (kept_loss + deferred_loss) / self.size, selective


def targets(population: Population, selective_coverage: float = 0.5) -> dict[str, float]:
    """The promises asked of a data set, from its population: the error target halfway between the classifier's error
    (no deferral) and the best error any threshold reaches, and the selective-risk target halfway between the
    classifier's error and its error on the `selective_coverage` share of the population with the lowest margins."""
    candidates = np.concatenate([[np.inf, -np.inf], population.sorted])
    _, errors, _ = population.at(candidates)
    classifier, best = float(errors[0]), float(errors.min())
    finite = population.sorted[np.isfinite(population.sorted)]
    kept_at = np.quantile(finite, selective_coverage, method="inverted_cdf") if finite.size else -np.inf
    selective = float(population.at(np.array([kept_at]))[2][0])
    return {"classifier_error": classifier, "best_error": best, "max_error": (classifier + best) / 2,
            "best_threshold": float(candidates[int(np.argmin(errors))]), "selective_at_coverage": selective,
            "max_selective_risk": (classifier + selective) / 2, "selective_coverage": selective_coverage}


def oracle_thresholds(population: Population, budget: float, max_error: float,
                      max_selective_risk: float) -> dict[str, float]:
    """The thresholds a rule that knew the population would pick: the fewest deferrals with at most `budget`
    deferred (never below 0, as `calibrate_deferral` keeps it), with system error at most `max_error`, with selective
    risk at most `max_selective_risk`."""
    candidates = np.unique(np.concatenate([[np.inf, -np.inf], population.sorted]))[::-1]  # fewest deferrals first
    rate, error, selective = population.at(candidates)
    within = candidates[rate <= budget + 1e-12]
    budget_t = max(float(within.min()), 0.0)
    error_t = float(candidates[np.argmax(error <= max_error + 1e-12)])
    with np.errstate(invalid="ignore"):
        selective_ok = np.nan_to_num(selective, nan=np.inf) <= max_selective_risk + 1e-12
    return {"budget": budget_t, "error": error_t,
            "selective": float(candidates[np.argmax(selective_ok)]) if selective_ok.any() else float("-inf")}


def _midpoints(sorted_desc: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per row, a threshold deferring the k highest margins of the row (descending): +inf for k = 0, -inf for
    k = n, else the midpoint between the k-th and the (k+1)-th highest."""
    rows, n = np.arange(len(k)), sorted_desc.shape[1]
    upper = sorted_desc[rows, np.clip(k - 1, 0, n - 1)]
    lower = sorted_desc[rows, np.clip(k, 0, n - 1)]
    with np.errstate(invalid="ignore"):
        middle = (upper + lower) / 2
    return np.where(k == 0, np.inf, np.where(k >= n, -np.inf, middle))


def plug_in_error_thresholds(margins: np.ndarray, loss_if_kept: np.ndarray, loss_if_deferred: np.ndarray,
                             max_error: float) -> np.ndarray:
    """Per draw (row), the plug-in threshold for a system-error target: the fewest deferrals (of the highest margins)
    whose error on the draw itself is at most `max_error`; NaN where none is. Vectorised over rows `[D, n]`.

    Example:

    ```python
    >>> m = np.array([[0.3, 0.2, 0.1]])
    >>> plug_in_error_thresholds(m, np.array([[1.0, 1.0, 0.0]]), np.array([[0.0, 0.0, 1.0]]), 0.34).tolist()
    [0.25]

    ```
    """
    order = np.argsort(-margins, axis=1, kind="stable")
    desc = np.take_along_axis(margins, order, axis=1)
    kept, deferred = (np.take_along_axis(a, order, axis=1) for a in (loss_if_kept, loss_if_deferred))
    n = margins.shape[1]
    zero = np.zeros((len(margins), 1))
    errors = (np.hstack([zero, np.cumsum(deferred, axis=1)]) + kept.sum(axis=1, keepdims=True)
              - np.hstack([zero, np.cumsum(kept, axis=1)])) / n  # [D, n + 1]: k = 0..n highest deferred
    ok = errors <= max_error + 1e-12
    k = np.argmax(ok, axis=1)
    return np.where(ok.any(axis=1), _midpoints(desc, k), np.nan)


def plug_in_selective_thresholds(margins: np.ndarray, loss_if_kept: np.ndarray,
                                 max_selective_risk: float) -> np.ndarray:
    """Per draw (row), the plug-in threshold for a selective-risk target: keep the most inputs (the lowest margins)
    whose classifier error on the draw is at most `max_selective_risk`; NaN where not even one can be kept.

    Example:

    ```python
    >>> plug_in_selective_thresholds(np.array([[0.3, 0.2, 0.1]]), np.array([[1.0, 0.0, 0.0]]), 0.3).tolist()
    [0.25]

    ```
    """
    order = np.argsort(margins, axis=1, kind="stable")
    ascending = np.take_along_axis(margins, order, axis=1)
    kept = np.take_along_axis(loss_if_kept, order, axis=1)
    n = margins.shape[1]
    risk = np.cumsum(kept, axis=1) / np.arange(1, n + 1)  # keeping the j + 1 lowest
    ok = risk <= max_selective_risk + 1e-12
    j = n - 1 - np.argmax(ok[:, ::-1], axis=1)  # the largest j that is ok
    return np.where(ok.any(axis=1), _midpoints(ascending[:, ::-1], n - 1 - j), np.nan)


def mapie_selective_threshold(margins: np.ndarray, loss_if_kept: np.ndarray, max_selective_risk: float,
                              confidence: float) -> float:
    """MAPIE's Learn-then-Test threshold for a selective risk: the classifier keeps an input (MAPIE's "positive")
    when its score `(1 - margin) / 2` is at least lambda, and precision (the share of kept inputs it gets right) is
    controlled at `1 - max_selective_risk` with `confidence` (`mapie.risk_control.BinaryClassificationController`, its
    defaults otherwise: Hoeffding-Bentkus p-values, Bonferroni-Holm over lambda in linspace(0, 0.99, 100), the
    valid lambda with the highest recall). A lambda that keeps no calibration input has a NaN p-value in MAPIE 1.6,
    on which its Bonferroni-Holm procedure stops and certifies nothing; it is read as 1 (no evidence) here. Returns
    the margin threshold `1 - 2 lambda` (defer iff margin > it), NaN when no lambda is certified."""
    import warnings

    from mapie.risk_control import BinaryClassificationController, FWERBonferroniHolm

    class HolmReadingNaNAsOne(FWERBonferroniHolm):  # a threshold that keeps nothing has p-value NaN in MAPIE 1.6,
        def run(self, p_values: np.ndarray, delta: float) -> np.ndarray:  # which stops its Holm procedure at once
            return super().run(np.nan_to_num(np.asarray(p_values, dtype=float), nan=1.0), delta)

    def keep_probability(x: np.ndarray) -> np.ndarray:
        score = (1.0 - np.asarray(x, dtype=np.float64).reshape(-1)) / 2.0
        return np.column_stack([1.0 - score, score])

    controller = BinaryClassificationController(keep_probability, risk="precision",
                                                target_level=1.0 - max_selective_risk, confidence_level=confidence,
                                                fwer_method=HolmReadingNaNAsOne())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no valid parameter" is a result here, counted as a refusal
        controller.calibrate(np.clip(margins, -1.0, 1.0).reshape(-1, 1), (1 - loss_if_kept).astype(int))
    best = controller.best_predict_param
    return float("nan") if best is None else 1.0 - 2.0 * float(best)


RULES = {
    "budget_empirical": ("budget", "empirical (floor(bn) highest margins)"),
    "budget_guaranteed": ("budget", "guaranteed (binomial order statistic)"),
    "error_plug_in": ("error", "plug-in (error on the draw <= target)"),
    "error_ltt": ("error", "guaranteed (Learn-then-Test, binomial p-values)"),
    "selective_plug_in": ("selective", "plug-in (selective risk on the draw <= target)"),
    "selective_ltt": ("selective", "guaranteed (Learn-then-Test, error_threshold(selective=True))"),
    "selective_mapie": ("selective", "MAPIE BinaryClassificationController (precision)"),
}
"""Rule key -> (the promise it makes, its name in the report)."""


def _summary(kind: str, rates: np.ndarray, errors: np.ndarray, selective: np.ndarray, refused: np.ndarray,
             limit: float) -> dict[str, Any]:
    """Violation frequency (a refusal promises nothing, so it breaks nothing) and the costs over the draws."""
    measured = {"budget": rates, "error": errors, "selective": selective}[kind]
    broken = np.zeros(len(refused), dtype=bool)
    broken[~refused] = np.nan_to_num(measured, nan=-np.inf) > limit + 1e-12
    made = ~refused
    mean = lambda v: float(np.nanmean(v)) if v.size and not np.isnan(v).all() else None  # noqa: E731
    counted = np.zeros(len(refused))  # the error of each draw, a refusal counting as none: E[err 1{certified}]
    counted[made] = np.nan_to_num(errors, nan=0.0)
    return {"violation": float(broken.mean()), "refused": float(refused.mean()),
            "error_counted": float(counted.mean()),
            "error_counted_se": float(counted.std(ddof=1) / np.sqrt(len(counted))) if len(counted) > 1 else None,
            "violation_when_made": float(broken[made].mean()) if made.any() else None,
            "deferral_rate": mean(rates), "error": mean(errors), "selective_risk": mean(selective),
            "worst": float(np.nanmax(measured)) if made.any() and not np.isnan(measured).all() else None}


def evaluate_thresholds(population: Population, margins: np.ndarray, loss_if_kept: np.ndarray,
                        loss_if_deferred: np.ndarray, thresholds: np.ndarray, kind: str,
                        limit: float) -> dict[str, dict[str, Any]]:
    """One threshold per draw (NaN: the rule refused), scored on the whole population (`pool`) and on the inputs of
    the population outside the draw (`rest`); the draws are the rows of `margins` and the losses `[D, n]`."""
    refused = np.isnan(thresholds)
    t = thresholds[~refused]
    rate, error, selective = population.at(t)
    out = {"pool": _summary(kind, rate, error, selective, refused, limit)}
    kept_pop, kept_loss_pop, deferred_loss_pop = population.counts(t)
    deferred = margins[~refused] > t[:, None]
    rest = population.size - margins.shape[1]
    kept = kept_pop - (~deferred).sum(axis=1)
    kept_loss = kept_loss_pop - (loss_if_kept[~refused] * ~deferred).sum(axis=1)
    deferred_loss = deferred_loss_pop - (loss_if_deferred[~refused] * deferred).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        selective_rest = np.where(kept > 0, kept_loss / np.maximum(kept, 1), np.nan)
    out["rest"] = _summary(kind, (rest - kept) / rest, (kept_loss + deferred_loss) / rest, selective_rest, refused,
                           limit)
    return out


def run_draws(pool: Pool, sizes: tuple[int, ...] = SIZES, draws: int = 1000, budget: float = 0.1,
              confidence: float = 0.9, seed: int = 0, mapie: bool = True, log: Callable[[str], None] = print,
              rules: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The rules of [`RULES`] (all, or `rules`) on `draws` random calibration draws of each size in `sizes` (those with
    2n <= N; the draws depend only on `seed` and n), scored on the population (see the module docstring); returns the
    record `results/guarantees.json` keeps per data set."""
    from hf_defer.evaluation.guarantees import budget_threshold, error_threshold

    population = Population(pool.margins, pool.loss_if_kept, pool.loss_if_deferred)
    goal = targets(population)
    oracle = oracle_thresholds(population, budget, goal["max_error"], goal["max_selective_risk"])
    limits = {"budget": budget, "error": goal["max_error"], "selective": goal["max_selective_risk"]}
    record: dict[str, Any] = {
        "name": pool.name, "description": pool.description, "details": pool.details, "pool": population.size,
        "targets": goal, "budget": budget, "confidence": confidence, "draws": draws,
        "oracle": {kind: dict(zip(("threshold", "deferral_rate", "error", "selective_risk"),
                                  [t, *(float(v[0]) for v in population.at(np.array([t])))]))
                   for kind, t in oracle.items()},
        "sizes": {}, "skipped": [n for n in sizes if 2 * n > population.size]}

    def ltt(m: np.ndarray, lk: np.ndarray, ld: np.ndarray | None, selective: bool = False) -> float:
        target = goal["max_selective_risk"] if selective else goal["max_error"]
        try:
            return error_threshold(m, lk, ld, max_error=target, confidence=confidence,
                                   **({"selective": True} if selective else {}))
        except ValueError:  # nothing certified at this n: a refusal
            return float("nan")

    for n in sizes:
        if 2 * n > population.size:
            continue
        rng = np.random.default_rng([seed, n])
        rows = np.stack([rng.choice(population.size, n, replace=False) for _ in range(draws)])
        m, lk, ld = pool.margins[rows], pool.loss_if_kept[rows], pool.loss_if_deferred[rows]
        thresholds: dict[str, np.ndarray] = {}
        seconds: dict[str, float] = {}
        calls = {
            "budget_empirical": lambda: [budget_threshold(row, budget) for row in m],
            "budget_guaranteed": lambda: [budget_threshold(row, budget, confidence=confidence) for row in m],
            "error_plug_in": lambda: plug_in_error_thresholds(m, lk, ld, goal["max_error"]),
            "error_ltt": lambda: [ltt(*row) for row in zip(m, lk, ld)],
            "selective_plug_in": lambda: plug_in_selective_thresholds(m, lk, goal["max_selective_risk"]),
            "selective_ltt": lambda: [ltt(row, loss, None, selective=True) for row, loss in zip(m, lk)],
            "selective_mapie": lambda: [mapie_selective_threshold(row, loss, goal["max_selective_risk"], confidence)
                                        for row, loss in zip(m, lk)],
        }
        for rule, call in calls.items():
            if (rule == "selective_mapie" and not mapie) or (rules is not None and rule not in rules):
                continue
            start = time.perf_counter()
            thresholds[rule] = np.asarray(call(), dtype=np.float64)
            seconds[rule] = round(time.perf_counter() - start, 3)
        record["sizes"][str(n)] = {
            rule: evaluate_thresholds(population, m, lk, ld, t, RULES[rule][0], limits[RULES[rule][0]])
            | {"seconds": seconds[rule]} for rule, t in thresholds.items()}
        log(f"{pool.name}, n={n}: " + ", ".join(
            f"{rule} {result['pool']['violation']:.3f}" for rule, result in record["sizes"][str(n)].items()))
    return record




CHEAPER_RULES = {
    "error_ltt": ("error", "Learn-then-Test (labelled inputs only, both ends)"),
    "error_ppi": ("error", "prediction-powered Learn-then-Test (+ unlabelled inputs)"),
    "error_expected": ("error", "guarantee='expected': conformal risk control on losses made monotone above a cap "
                                "(the unlabelled inputs' least predicted error)"),
    "error_expected_nocap": ("error", "guarantee='expected' without unlabelled inputs (cap at threshold 0)"),
    "error_betting": ("error", "the prediction-powered test's betting test with the estimates ignored (lambda = 0)"),
    "error_union": ("error", "Learn-then-Test at 0.8 of the level or prediction-powered at 0.2, whichever defers less"),
    "selective_ltt": ("selective", "Learn-then-Test (labelled inputs only, both ends)"),
    "selective_ppi": ("selective", "prediction-powered Learn-then-Test (+ unlabelled inputs)"),
}
"""The rules of issue 47 (results/guarantees.md, "Cheaper promises"), on the first draws of `run_draws`."""


def betting_error_threshold(margins: np.ndarray, loss_if_kept: np.ndarray, loss_if_deferred: np.ndarray,
                            max_error: float, confidence: float) -> float:
    """The prediction-powered test at lambda = 0 (the estimates ignored, no unlabelled bound): its betting test on the
    labelled losses alone, at the whole level, in the same two fixed sequences over its lattice. What PPI++ would fall
    back to where the estimates carry nothing, against Learn-then-Test's exact binomial p-values."""
    from hf_defer.evaluation import guarantees as g

    lattice = g._lattice(margins, g.PPI_GRID_STEP)
    clear = g._clear(margins, lattice, g.MARGIN_TOLERANCE)

    def test(alpha: float, level: float, points: slice = slice(None)) -> np.ndarray:
        chosen = lattice[points]
        z = np.where(margins[None, :] > chosen[:, None], loss_if_deferred[None, :], loss_if_kept[None, :])
        return g._betting_rejects(z, np.full(chosen.size, alpha), level)

    return g._error_threshold(margins, test, max_error, "system error", 1.0 - confidence, lattice, clear, 0.0,
                              confidence, False)


def prediction_quality(pool: Pool) -> dict[str, float]:
    """How well the model predicts its losses on the pool: the means of the losses and of their predictions, and, at
    the oracle threshold of the error target, the variance of the system loss and of (loss - predicted loss), the
    two quantities that set the width of Learn-then-Test's bound and of the prediction-powered correction's."""
    population = Population(pool.margins, pool.loss_if_kept, pool.loss_if_deferred)
    goal = targets(population)
    t = oracle_thresholds(population, 0.1, goal["max_error"], goal["max_selective_risk"])["error"]
    deferred = pool.margins > t
    loss = np.where(deferred, pool.loss_if_deferred, pool.loss_if_kept)
    predicted = np.where(deferred, pool.predicted_if_deferred, pool.predicted_if_kept)
    return {"predicted_if_kept": float(pool.predicted_if_kept.mean()), "loss_if_kept": float(pool.loss_if_kept.mean()),
            "predicted_if_deferred": float(pool.predicted_if_deferred.mean()),
            "loss_if_deferred": float(pool.loss_if_deferred.mean()), "loss_variance": float(loss.var()),
            "residual_variance": float((loss - predicted).var()),
            # PPI++ (Angelopoulos et al. 2023b): the correction L - lambda f at its best lambda = Cov(L, f) / Var(f)
            # has variance Var(L) (1 - rho^2); lambda = 1 is plain PPI's.
            "predicted_variance": float(predicted.var()),
            "best_lambda": float(np.cov(loss, predicted)[0, 1] / predicted.var(ddof=1)),
            "best_residual_variance": float(loss.var() * (1 - np.corrcoef(loss, predicted)[0, 1] ** 2))}


def ppi_ceiling(pool: Pool, n: int, draws: int = 200, confidence: float = 0.9, seed: int = 0) -> dict[str, Any]:
    """What a prediction-powered test could at best do with n labelled inputs: the best correction's variance is
    ``(1 - rho^2)`` of the loss's ([`prediction_quality`]), so its bound is at best as wide as Learn-then-Test's with
    ``n / (1 - rho^2)`` labelled inputs and the exact binomial p-values (optimistic: the bounds that hold for a
    corrected, non-0/1 loss are wider). Learn-then-Test at that effective n on `draws` draws of it: refusals and the
    deferral where certified."""
    from hf_defer.evaluation.guarantees import error_threshold

    quality = prediction_quality(pool)
    effective = int(round(n * quality["loss_variance"] / quality["best_residual_variance"]))
    population = Population(pool.margins, pool.loss_if_kept, pool.loss_if_deferred)
    goal = targets(population)
    rng = np.random.default_rng([seed, effective])
    thresholds = []
    for _ in range(draws):
        rows = rng.choice(population.size, min(effective, population.size), replace=False)
        try:
            thresholds.append(error_threshold(pool.margins[rows], pool.loss_if_kept[rows], pool.loss_if_deferred[rows],
                                              max_error=goal["max_error"], confidence=confidence))
        except ValueError:
            thresholds.append(float("nan"))
    t = np.asarray(thresholds)
    rates = population.at(t[~np.isnan(t)])[0]
    return {"n": n, "effective_n": effective, "draws": draws, "refused": float(np.isnan(t).mean()),
            "deferral_rate": float(rates.mean()) if rates.size else None}


def run_cheaper_draws(pool: Pool, sizes: tuple[int, ...] = (100, 300, 1000), draws: int = 200,
                      confidence: float = 0.9, seed: int = 0, unlabeled: int = 5000,
                      log: Callable[[str], None] = print, rules: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Issue 47's rules ([`CHEAPER_RULES`], all or `rules`) on the first `draws` calibration draws of [`run_draws`]
    (the same draws: same seed, same order), each with up to `unlabeled` inputs of the rest of the pool as its
    unlabelled set (the model's predicted losses only). Returns the summaries per size, as `run_draws`, under the
    same keys."""
    from hf_defer.evaluation.guarantees import certify_threshold, error_threshold

    if pool.predicted_if_kept is None:
        raise ValueError(f"Pool {pool.name!r} has no predicted losses: rebuild it (scripts/guarantees.py).")
    population = Population(pool.margins, pool.loss_if_kept, pool.loss_if_deferred)
    goal = targets(population)
    limits = {"error": goal["max_error"], "selective": goal["max_selective_risk"]}
    record: dict[str, Any] = {"name": pool.name, "draws": draws, "unlabeled": unlabeled, "sizes": {},
                              "calibration": prediction_quality(pool)}

    def refusing(call: Callable[[], float]) -> float:
        try:
            return call()
        except ValueError:  # nothing certified at this n: a refusal
            return float("nan")

    for n in sizes:
        if 2 * n > population.size:
            continue
        rng = np.random.default_rng([seed, n])
        rows = np.stack([rng.choice(population.size, n, replace=False) for _ in range(draws)])
        extra = np.random.default_rng([seed, n, 47])
        m, lk, ld = pool.margins[rows], pool.loss_if_kept[rows], pool.loss_if_deferred[rows]
        pk, pd = pool.predicted_if_kept[rows], pool.predicted_if_deferred[rows]
        others = []
        for row in rows:
            rest = np.setdiff1d(np.arange(population.size), row)
            pick = extra.choice(rest, min(unlabeled, rest.size), replace=False)
            others.append({"margins": pool.margins[pick], "predicted_if_kept": pool.predicted_if_kept[pick],
                           "predicted_if_deferred": pool.predicted_if_deferred[pick]})

        def ppi(i: int, selective: bool, level: float = confidence) -> float:
            target = limits["selective" if selective else "error"]
            return certify_threshold(m[i], confidence=level, max_error=target, loss_if_kept=lk[i],
                                     loss_if_deferred=None if selective else ld[i], selective=selective,
                                     predicted_if_kept=pk[i], predicted_if_deferred=None if selective else pd[i],
                                     unlabeled=others[i]).threshold

        calls = {
            "error_ltt": lambda: [refusing(lambda i=i: error_threshold(m[i], lk[i], ld[i], max_error=limits["error"],
                                                                       confidence=confidence)) for i in range(draws)],
            "error_ppi": lambda: [refusing(lambda i=i: ppi(i, False)) for i in range(draws)],
            "error_expected": lambda: [refusing(lambda i=i: certify_threshold(
                m[i], max_error=limits["error"], loss_if_kept=lk[i], loss_if_deferred=ld[i], guarantee="expected",
                unlabeled=others[i]).threshold) for i in range(draws)],
            "error_expected_nocap": lambda: [refusing(lambda i=i: certify_threshold(
                m[i], max_error=limits["error"], loss_if_kept=lk[i], loss_if_deferred=ld[i],
                guarantee="expected").threshold) for i in range(draws)],
            "error_betting": lambda: [refusing(lambda i=i: betting_error_threshold(m[i], lk[i], ld[i], limits["error"],
                                                                            confidence)) for i in range(draws)],
            "error_union": lambda: [np.nanmax([refusing(lambda i=i: error_threshold(
                m[i], lk[i], ld[i], max_error=limits["error"], confidence=1 - 0.8 * (1 - confidence))),
                refusing(lambda i=i: ppi(i, False, 1 - 0.2 * (1 - confidence))), -np.inf]) for i in range(draws)],
            "selective_ltt": lambda: [refusing(lambda i=i: error_threshold(
                m[i], lk[i], None, max_error=limits["selective"], confidence=confidence, selective=True))
                for i in range(draws)],
            "selective_ppi": lambda: [refusing(lambda i=i: ppi(i, True)) for i in range(draws)],
        }
        results = {}
        for rule, call in calls.items():
            if rules is not None and rule not in rules:
                continue
            start = time.perf_counter()
            thresholds = np.asarray(call(), dtype=np.float64)
            thresholds[np.isneginf(thresholds)] = np.nan  # error_union: neither certified
            kind = CHEAPER_RULES[rule][0]
            results[rule] = evaluate_thresholds(population, m, lk, ld, thresholds, kind, limits[kind]) | {
                "seconds": round(time.perf_counter() - start, 3)}
        record["sizes"][str(n)] = results
        log(f"{pool.name}, n={n}: " + ", ".join(
            f"{rule} broken {r['pool']['violation']:.3f} refused {r['pool']['refused']:.3f} deferred "
            f"{r['pool']['deferral_rate'] if r['pool']['deferral_rate'] is None else round(r['pool']['deferral_rate'], 3)}"
            for rule, r in results.items()))
    return record
