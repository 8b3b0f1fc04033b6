"""The anytime-valid statistics: hand-worked wealth, coverage of the confidence sequence at all checked times over
many simulated streams, and the false-alarm probability of the change detector against a repeated window test."""

import math

import numpy as np
import pytest
from scipy.stats import binom

from hf_defer.monitoring.sequential import BettingConfidenceSequence, ChangeDetector

WEIGHT_NORM = 1 / (2 * math.log(2) ** 2) + 1 / math.log(2)


def tolerance(rate: float, n: int) -> float:
    """The largest share of n Bernoulli(rate) trials that a correct test exceeds with probability below 1e-4."""
    return binom.ppf(1 - 1e-4, n, rate) / n


def test_wealth_by_hand():
    cs = BettingConfidenceSequence(bets=1)  # one bet: lambda = 1/2 / m upwards, 1/2 / (1 - m) downwards
    cs.update([1, 1, 1, 0])
    # at m = 0.5: lambda = 1: (1 + 0.5)^3 (1 - 0.5) upwards, (1 - 0.5)^3 (1 + 0.5) downwards
    assert cs.log_wealth(0.5, "up") == pytest.approx(math.log(1.5 ** 3 * 0.5))
    assert cs.log_wealth(0.5, "down") == pytest.approx(math.log(0.5 ** 3 * 1.5))
    two = BettingConfidenceSequence(bets=2)  # lambdas 1/(2m) and 1/(4m), averaged
    two.update([1.0])
    assert two.log_wealth(0.25, "up") == pytest.approx(math.log((1 + 2 * 0.75 + 1 + 1 * 0.75) / 2))
    assert cs.n == 4 and cs.mean == 0.75


def test_values_off_the_lattice_round_against_the_bet():
    cs = BettingConfidenceSequence(bets=1)
    cs.update([0.1234])  # kept as 0.123 for the upward bet, 0.124 for the downward one
    assert cs.log_wealth(0.5, "up") == pytest.approx(math.log(1 + (0.123 - 0.5)))
    assert cs.log_wealth(0.5, "down") == pytest.approx(math.log(1 + (0.5 - 0.124)))
    assert cs.mean == pytest.approx(0.1234)


def test_interval_is_everything_before_data_and_shrinks():
    cs = BettingConfidenceSequence()
    assert cs.interval(0.1) == (0.0, 1.0)
    rng = np.random.default_rng(1)
    widths = []
    for _ in range(4):
        cs.update(rng.random(2000) < 0.3)
        low, high = cs.interval(0.1)
        widths.append(high - low)
        assert low < cs.mean < high
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.06


@pytest.mark.parametrize("draw", ["bernoulli", "beta"])
def test_confidence_sequence_covers_at_all_checked_times(draw):
    alpha, streams, checks, batch = 0.1, 120, 8, 200
    rng = np.random.default_rng(7)
    missed = 0
    for _ in range(streams):
        cs = BettingConfidenceSequence()
        truth = 0.1 if draw == "bernoulli" else 2 / (2 + 5)
        miss = False
        for _ in range(checks):
            cs.update(rng.random(batch) < 0.1 if draw == "bernoulli" else rng.beta(2, 5, size=batch))
            low, high = cs.interval(alpha)
            miss |= not low <= truth <= high
        missed += miss
    assert missed / streams <= tolerance(alpha, streams)


def test_detector_evidence_by_hand():
    detector = ChangeDetector(target=0.5, alpha=0.1, bets=1, stride=1)  # lambda = 1/2 / 0.5 = 1; a start per value
    detector.update([1.0])
    w1 = 1 / (WEIGHT_NORM * 2 * math.log(2) ** 2)
    assert detector.evidence == pytest.approx(w1 * 1.5 + (1 - w1))
    detector.update([0.0])  # process 1: 1.5 * 0.5; process 2: 0.5; weights w1, w2; cash 1 - w1 - w2
    w2 = 1 / (WEIGHT_NORM * 3 * math.log(3) ** 2)
    assert detector.evidence == pytest.approx(w1 * 0.75 + w2 * 0.5 + (1 - w1 - w2))
    assert detector.alarm_at is None and detector.n == 2


def test_starts_every_stride_and_horizon_weights_by_hand():
    c = WEIGHT_NORM
    detector = ChangeDetector(target=0.5, alpha=0.1, bets=1, stride=2)  # processes start at values 1 and 3
    detector.update([1.0, 0.0, 1.0])
    w1, w2 = 1 / (c * 2 * math.log(2) ** 2), 1 / (c * 3 * math.log(3) ** 2)
    assert detector.evidence == pytest.approx(w1 * 1.5 * 0.5 * 1.5 + w2 * 1.5 + (1 - w1 - w2))
    # horizon 4 with stride 2: the starts at values 1 and 3 share 0.9; the one at 5 is the first after it
    detector = ChangeDetector(target=0.5, alpha=0.1, bets=1, stride=2, horizon=4)
    detector.update([1.0, 0.0])
    detector.update([1.0, 1.0, 1.0])
    w3 = 0.1 / (c * 2 * math.log(2) ** 2)
    expected = 0.45 * 1.5 * 0.5 * 1.5 ** 3 + 0.45 * 1.5 ** 3 + w3 * 1.5 + (1 - 0.9 - w3)
    assert detector.evidence == pytest.approx(expected)


@pytest.mark.parametrize("options", [{}, {"stride": 1}, {"horizon": 3000}, {"horizon": 500}])
def test_false_alarms_stay_below_alpha_where_a_repeated_window_test_does_not(options):
    alpha, streams, length, window = 0.1, 300, 3000, 200
    rng = np.random.default_rng(3)
    alarms = naive = 0
    limit = binom.ppf(1 - alpha, window, 0.1)  # the one-window test at level alpha, repeated on each window
    for _ in range(streams):
        x = rng.random(length) < 0.1  # exactly at the target: the hardest unshifted stream
        detector = ChangeDetector(target=0.1, alpha=alpha, **options)
        for chunk in np.split(x, 10):
            detector.update(chunk)
        alarms += detector.alarm_at is not None
        naive += bool((x.reshape(-1, window).sum(axis=1) > limit).any())
    assert alarms / streams <= tolerance(alpha, streams)
    assert naive / streams > 0.5  # 15 windows at level 0.1 each: about 1 - 0.9^15 = 0.79


def test_detects_a_shift_soon_after_it_and_says_since_when():
    rng = np.random.default_rng(5)
    delays, starts = [], []
    for _ in range(40):
        detector = ChangeDetector(target=0.1, alpha=0.05)
        detector.update(rng.random(4000) < 0.08)
        detector.update(rng.random(3000) < 0.25)
        assert detector.alarm_at is not None and detector.alarm_at > 4000
        delays.append(detector.alarm_at - 4000)
        starts.append(detector.since)
    assert np.median(delays) < 400
    assert abs(np.median(starts) - 4000) < 150


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="target"):
        ChangeDetector(target=1.0, alpha=0.1)
    with pytest.raises(ValueError, match="alpha"):
        ChangeDetector(target=0.1, alpha=0)
    with pytest.raises(ValueError, match="horizon must be a positive whole number, got 0"):
        ChangeDetector(target=0.1, alpha=0.1, horizon=0)
    with pytest.raises(ValueError, match="stride must be a positive whole number, got 2.5"):
        ChangeDetector(target=0.1, alpha=0.1, stride=2.5)
    with pytest.raises(ValueError, match=r"values must lie in \[0, 1\], got 1.5 at position 1"):
        BettingConfidenceSequence().update([0.2, 1.5])
