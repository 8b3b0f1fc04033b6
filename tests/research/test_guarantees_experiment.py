"""The experiment behind results/guarantees.md (research.guarantees_draws), on small synthetic arrays whose
answers are worked out by hand, by brute force or from a binomial tail."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from research.guarantees_draws import (Pool, Population, evaluate_thresholds, oracle_thresholds,
                                             plug_in_error_thresholds, plug_in_selective_thresholds, targets)


def test_population_matches_a_direct_count():
    rng = np.random.default_rng(0)
    margins = rng.normal(size=300)
    margins[:5] = -np.inf  # nobody available: kept at every threshold
    kept, deferred = (rng.uniform(size=300) < p for p in (0.3, 0.1))
    population = Population(margins, kept, deferred)
    thresholds = np.array([-np.inf, -1.0, 0.0, 0.37, 2.0, np.inf, margins[7]])
    rate, error, selective = population.at(thresholds)
    for i, t in enumerate(thresholds):
        defer = margins > t
        assert rate[i] == pytest.approx(defer.mean())
        assert error[i] == pytest.approx(np.where(defer, deferred, kept).mean())
        assert selective[i] == pytest.approx(kept[~defer].mean())


def test_targets_and_oracle_on_a_hand_worked_population():
    # Margins 0.1 .. 0.4; the classifier errs on the two highest, the expert never: classifier error 1/2, best 0.
    population = Population(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.0, 0.0, 1.0, 1.0]), np.zeros(4))
    goal = targets(population)
    assert (goal["classifier_error"], goal["best_error"], goal["max_error"]) == (0.5, 0.0, 0.25)
    assert goal["max_selective_risk"] == 0.25  # halfway between 1/2 and 0, the error on the two lowest margins
    oracle = oracle_thresholds(population, 0.25, goal["max_error"], goal["max_selective_risk"])
    # error 1/4 by deferring only 0.4; selective risk <= 1/4 needs both 0.3 and 0.4 deferred (1/3 with 0.3 kept)
    assert oracle == {"budget": 0.3, "error": 0.3, "selective": 0.2}


def _fewest(errors: np.ndarray, limit: float) -> int | None:
    ok = np.flatnonzero(errors <= limit + 1e-12)
    return int(ok[0]) if ok.size else None


def test_plug_in_rules_match_brute_force():
    rng = np.random.default_rng(1)
    margins = rng.uniform(-1, 1, size=(40, 25))
    kept = (rng.uniform(size=margins.shape) < 0.4).astype(float)
    deferred = (rng.uniform(size=margins.shape) < 0.2).astype(float)
    error_t = plug_in_error_thresholds(margins, kept, deferred, 0.3)
    selective_t = plug_in_selective_thresholds(margins, kept, 0.25)
    for row in range(len(margins)):
        order = np.argsort(-margins[row])
        errors = np.array([np.where(np.isin(np.arange(25), order[:k]), deferred[row], kept[row]).mean()
                           for k in range(26)])  # defer the k highest margins
        k = _fewest(errors, 0.3)
        if k is None:
            assert np.isnan(error_t[row])
        else:
            assert (margins[row] > error_t[row]).sum() == k
        risks = np.array([kept[row][order[k:]].mean() if k < 25 else np.inf for k in range(26)])
        k = _fewest(risks, 0.25)
        if k is None:
            assert np.isnan(selective_t[row])
        else:
            assert (margins[row] > selective_t[row]).sum() == k


def test_violation_rate_of_an_order_statistic_is_the_binomial_tail():
    """Deferring above the 10th highest of n = 100 margins breaks a 10 % budget exactly when fewer than 10 of the
    100 draws come from the top 10 % of the population: a hypergeometric tail, 0.451 (0.4513 for the binomial)."""
    size, n, draws = 100_000, 100, 4000
    margins = (np.arange(size) + 0.5) / size  # exactly 10,000 of them at or above 0.9
    zeros = np.zeros(size)
    population = Population(margins, zeros, zeros)
    rng = np.random.default_rng(2)
    rows = np.stack([rng.choice(size, n, replace=False) for _ in range(draws)])
    drawn = margins[rows]
    thresholds = -np.sort(-drawn, axis=1)[:, 9]
    result = evaluate_thresholds(population, drawn, zeros[rows], zeros[rows], thresholds, "budget", 0.1)
    expected = stats.hypergeom(size, size // 10, n).cdf(9)
    tolerance = 4 * np.sqrt(expected * (1 - expected) / draws)
    assert result["pool"]["violation"] == pytest.approx(expected, abs=tolerance)
    assert result["pool"]["refused"] == 0.0
    assert result["pool"]["deferral_rate"] == pytest.approx(10 / 101, abs=0.003)  # 1 - E[10th highest of 100]
    assert result["rest"]["violation"] == pytest.approx(expected, abs=tolerance + 0.02)


def test_refused_draws_promise_nothing():
    population = Population(np.array([0.1, 0.2]), np.array([1.0, 0.0]), np.array([0.0, 0.0]))
    drawn = np.array([[0.1], [0.2]])
    result = evaluate_thresholds(population, drawn, np.zeros((2, 1)), np.zeros((2, 1)), np.array([np.nan, -1.0]),
                                 "error", 0.1)
    assert result["pool"]["refused"] == 0.5
    assert result["pool"]["violation"] == 0.0  # the threshold -1 defers both, to an expert who is always right
    assert result["pool"]["deferral_rate"] == 1.0


def test_pool_rejects_losses_that_are_not_zero_or_one():
    with pytest.raises(ValueError, match="loss_if_kept must hold 0/1 losses"):
        Pool("x", np.zeros(2), np.array([0.5, 1.0]), np.zeros(2))


def test_mapie_certifies_a_threshold_the_population_supports():
    pytest.importorskip("mapie")
    from research.guarantees_draws import mapie_selective_threshold

    margins = np.linspace(-1, 1, 2001)
    # Right wherever the margin is <= 0: keeping margins <= x has precision 0.5 / ((x + 1) / 2), so 0.9 needs x <= 1/9.
    threshold = mapie_selective_threshold(margins, (margins > 0).astype(float), 0.1, 0.9)
    assert -0.2 < threshold <= 1 / 9
    assert mapie_selective_threshold(margins, np.zeros_like(margins), 0.1, 0.9) == pytest.approx(1.0)  # keeps all
    # Margins within [-0.5, 0.5]: MAPIE's thresholds above 0.75 keep nothing (a NaN p-value, read as 1). Keeping
    # margins <= x has precision 0.5 / (x + 0.5), so 0.9 needs x <= 1/18.
    narrow = np.linspace(-0.5, 0.5, 2001)
    assert -0.2 < mapie_selective_threshold(narrow, (narrow > 0).astype(float), 0.1, 0.9) <= 1 / 18


@pytest.mark.slow  # about 15 s: 80 draws of Learn-then-Test, twice
def test_run_draws_keeps_the_promises_it_guarantees():
    pytest.importorskip("hf_defer.evaluation.guarantees")
    from research.guarantees_draws import run_draws

    rng = np.random.default_rng(3)
    margins = rng.uniform(-1, 1, size=5000)
    kept = (rng.uniform(size=5000) < 0.1 + 0.3 * (margins + 1) / 2).astype(float)  # errs more at high margins
    deferred = (rng.uniform(size=5000) < 0.1).astype(float)
    record = run_draws(Pool("synthetic", margins, kept, deferred), sizes=(200, 4000), draws=80, mapie=False,
                       log=lambda _: None)
    assert record["skipped"] == [4000]
    result = record["sizes"]["200"]
    assert 0.3 < result["budget_empirical"]["pool"]["violation"] < 0.7
    assert result["budget_guaranteed"]["pool"]["violation"] <= 0.1 + 3 * np.sqrt(0.09 / 80)
    assert result["error_ltt"]["pool"]["violation"] <= 0.1 + 3 * np.sqrt(0.09 / 80)
    assert result["budget_guaranteed"]["pool"]["deferral_rate"] < 0.1


def test_report_states_the_numbers_of_the_record(tmp_path):
    from research.guarantees_draws import RULES
    from research.guarantees_report import findings, guarantees_markdown, plot_violations

    summary = {"violation": 0.5, "refused": 0.0, "deferral_rate": 0.1, "error": 0.2, "selective_risk": 0.1}
    rules = {rule: {"pool": dict(summary), "rest": dict(summary)} for rule in RULES}
    rules["budget_guaranteed"]["pool"] |= {"violation": 0.083, "deferral_rate": 0.0871}
    oracle = {"deferral_rate": 0.1, "error": 0.2, "selective_risk": 0.1, "threshold": 0.0}
    pool = {"name": "Toy", "description": "a toy", "pool": 1000, "skipped": [3000], "confidence": 0.9,
            "targets": {"classifier_error": 0.3, "best_error": 0.1, "max_error": 0.2, "max_selective_risk": 0.15,
                        "selective_coverage": 0.5},
            "oracle": {kind: dict(oracle) for kind in ("budget", "error", "selective")}, "sizes": {"100": rules}}
    record = {"settings": {"confidence": 0.9, "budget": 0.1, "draws": 1000, "date": "today", "machine": "m"},
              "pools": [pool]}
    record["findings"] = findings(record)
    text = guarantees_markdown(record)
    assert "| Toy | 100 | 50.0 % | 8.3 % | 10.0 % | 8.7 % | 10.0 %" in text  # the budget table's first cells
    assert "the guaranteed rule in 8.3 % (Toy, n=100) to 8.3 % (Toy, n=100)" in text
    assert "| 3000 |" in text  # the size the pool could not hold
    plot_violations(record, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # about 20 s: 40 draws of the prediction-powered test, twice
def test_cheaper_draws_keep_the_promises_and_report():
    from research.guarantees_draws import run_cheaper_draws
    from research.guarantees_report import cheaper_markdown

    rng = np.random.default_rng(4)
    margins = rng.uniform(-1, 1, size=3000)
    predicted_kept = 0.1 + 0.3 * (margins + 1) / 2
    kept = (rng.uniform(size=3000) < predicted_kept).astype(float)
    deferred = (rng.uniform(size=3000) < 0.1).astype(float)
    pool = Pool("synthetic", margins, kept, deferred, predicted_if_kept=predicted_kept,
                predicted_if_deferred=np.full(3000, 0.1))
    entry = run_cheaper_draws(pool, sizes=(300,), draws=40, unlabeled=1000, log=lambda _: None)
    result = entry["sizes"]["300"]
    assert set(result) == {"error_ltt", "error_ppi", "error_expected", "error_expected_nocap", "error_betting",
                           "error_union", "selective_ltt", "selective_ppi"}
    for rule in ("error_ltt", "error_ppi", "error_betting", "error_union", "selective_ltt", "selective_ppi"):
        assert result[rule]["pool"]["violation"] <= 0.1 + 3 * np.sqrt(0.09 / 40)
    target = targets(Population(margins, kept, deferred))["max_error"]
    for rule in ("error_expected", "error_expected_nocap"):  # the mean error, a refusal counting as none
        summary = result[rule]["pool"]
        assert summary["error_counted"] <= target + 3 * summary["error_counted_se"]
    population = Population(margins, kept, deferred)
    record = {"pools": [{"name": "synthetic", "targets": targets(population), "oracle": {
        kind: {"deferral_rate": 0.1} for kind in ("error", "selective")}}], "cheaper": [entry],
        "cheaper_settings": {"draws": 40, "unlabeled": 1000, "sizes": [300], "date": "today", "machine": "m"}}
    text = "\n".join(cheaper_markdown(record))
    ppi = result["error_ppi"]["pool"]
    assert f"| synthetic | 300 | {100 * result['error_ltt']['pool']['violation']:.1f} % | " \
           f"{100 * ppi['violation']:.1f} % |" in text
    with pytest.raises(ValueError, match="no predicted losses"):
        run_cheaper_draws(Pool("bare", margins, kept, deferred), sizes=(300,), draws=2)
