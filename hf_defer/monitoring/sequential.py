"""Anytime-valid statistics for a stream of values in [0, 1]: a confidence sequence for their mean and a test of
"the mean has stayed at most ``target``" that may be checked after every input (testing by betting).

Both rest on *wealth processes*: a gambler who starts with 1 and bets a fraction ``lambda`` of it on each value
``x`` turns it into ``K = prod (1 + lambda (x - m))``. When every value's conditional mean is at most ``m`` (given all
earlier ones), ``K`` is a nonnegative supermartingale for every ``0 <= lambda <= 1 / m``, and Ville's inequality gives
``P(K_t >= 1 / alpha for some t) <= alpha``: the test can be looked at after every input without the false-alarm
probability growing with time, unlike a test repeated on fixed windows (Ramdas, Grunwald, Vovk, Shafer, "Game-theoretic
statistics and safe anytime-valid inference", Statistical Science 2023).

* [`BettingConfidenceSequence`]: the confidence sequence of Waudby-Smith & Ramdas ("Estimating means of bounded random
  variables by betting", JRSS B 2024), with a fixed grid of bets averaged (their "grid Kelly" capital process, Section
  5.6) on both sides (their hedged capital with equal weights): the set of means ``m`` at which neither the upward nor
  the downward wealth has reached ``2 / alpha``. It covers the running mean of the values' conditional means at all
  times at once with probability at least ``1 - alpha``. The values are kept as counts on a lattice of step 1/1000,
  each rounded against the bet (down for the upward wealth, up for the downward one), which can only lower the wealth:
  the sequence stays valid, exact for 0/1 values, at most 1/1000 wider for others.
* [`ChangeDetector`]: the one-sided test of ``H0: E[x_i | past] <= target for every i``, built to notice a change late
  in a long stream. A wealth process started at every input ``s`` (a grid of bets averaged, as above), mixed with
  weights ``w_s`` summing to at most 1 and the weight of the processes not started yet kept as cash, is still a
  nonnegative supermartingale starting at 1 under ``H0``, so Ville's inequality holds for the mixture: the alarm
  (mixture ``>= 1 / alpha``) is false with probability at most ``alpha`` over the whole stream. After a change at
  ``s`` the process started there grows at the Kullback-Leibler rate and crosses ``1 / (alpha w_s)``: the delay grows
  with ``log(1 / alpha) + log(1 / w_s)``, i.e. with the logarithm of the change's position, not with the stream's
  length (Podkopaev & Ramdas, "Tracking the risk of a deployed model and detecting harmful distribution shifts", ICLR
  2022, test by betting a tolerance above the source risk; the mixture over start times is the e-detector idea of Shin,
  Ramdas & Rinaldo, "E-detectors", 2023, with summable weights so that the false-alarm *probability*, not only the
  average run length, is controlled). Processes start every ``stride`` inputs (default 50: the k-th start, at input
  ``(k - 1) stride + 1``, weighs ``w_k = 1 / (C (k + 1) log(k + 1)^2)``, ``C = 2.4834`` an upper bound on their sum),
  so that a change at input 2,000 costs about 7 nats above ``log(1/alpha)`` instead of the 12.6 of a start at every
  input; a change between two starts costs the process started after it at most ``stride - 1`` of its inputs. With a
  ``horizon`` (the inputs a review period is planned to hold, as a test on fixed windows must know), the starts up to
  it share ``0.9`` equally and those after it the remaining ``0.1`` as above: a change inside the horizon then costs
  only ``log(horizon / stride / 0.9)``, and the guarantee still holds past the horizon, which only makes later
  changes slower to catch. Either way the weights are fixed before any value is seen and sum to at most 1, so
  Ville's inequality holds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BettingConfidenceSequence", "ChangeDetector"]

LATTICE = 1000
"""Values are kept as counts on ``k / LATTICE`` (rounded against the bet)."""

_TAIL = 0.1  # with a horizon, the share of the weights left for starts after it

_WEIGHT_NORM = 1.0 / (2.0 * math.log(2.0) ** 2) + 1.0 / math.log(2.0)  # >= sum_{s>=1} 1 / ((s+1) log(s+1)^2)


def _check_values(values: Any, name: str = "values") -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(x) | (x < 0) | (x > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [0, 1], got {float(x[i])!r} at position {i}.")
    return x


def _check_alpha(alpha: Any) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}.")
    return float(alpha)


def _log_mean_exp(logs: np.ndarray, axis: int = 0) -> np.ndarray:
    top = np.max(logs, axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.mean(np.exp(logs - top), axis=axis))


class BettingConfidenceSequence:
    r"""A confidence sequence for the mean of values in [0, 1], valid at all times at once (see the module's docstring).

    ``interval(alpha)`` holds, with probability at least ``1 - alpha`` simultaneously for every number of values seen,
    the running mean of their conditional means ``(1/t) sum_i E[x_i | x_1..x_{i-1}]`` (the common mean when they are
    i.i.d.). The bets are ``lambda_g = 2^-g / m`` upwards and ``2^-g / (1 - m)`` downwards, ``g = 1..bets``, averaged.

    Args:
        bets (`int`, *optional*, defaults to 12): how many bet sizes are averaged (the smallest, ``2^-bets``, sets how
            narrow the interval gets on long streams).

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.monitoring.sequential import BettingConfidenceSequence
    >>> cs = BettingConfidenceSequence()
    >>> cs.update(np.r_[np.ones(100), np.zeros(900)])  # 10 % ones
    >>> cs.n, cs.mean
    (1000, 0.1)
    >>> low, high = cs.interval(0.05)
    >>> 0.07 < low < 0.1 < high < 0.14
    True

    ```
    """

    def __init__(self, bets: int = 12) -> None:
        self.bets = int(bets)
        self.low_counts = np.zeros(LATTICE + 1, dtype=np.int64)  # values rounded down
        self.high_counts = np.zeros(LATTICE + 1, dtype=np.int64)  # values rounded up
        self.n = 0
        self.total = 0.0

    def update(self, values: Any) -> None:
        """Adds values in [0, 1] (an array; order does not matter to this sequence)."""
        x = _check_values(values)
        if x.size == 0:
            return
        scaled = x * LATTICE
        # a value within 1e-9 of a lattice point is that point (0.1 * 1000 = 100.00000000000001)
        near = np.rint(scaled)
        on = np.abs(scaled - near) < 1e-6
        np.add.at(self.low_counts, np.where(on, near, np.floor(scaled)).astype(np.int64), 1)
        np.add.at(self.high_counts, np.where(on, near, np.ceil(scaled)).astype(np.int64), 1)
        self.n += int(x.size)
        self.total += float(x.sum())

    @property
    def mean(self) -> float | None:
        """The mean of the values seen (`None` before any)."""
        return self.total / self.n if self.n else None

    def log_wealth(self, m: float, side: str) -> float:
        """The log of the averaged wealth at mean ``m`` in (0, 1): ``side="up"`` bets the mean exceeds ``m``,
        ``"down"`` that it falls short."""
        return self._wealth_function(side)(m)

    def _wealth_function(self, side: str) -> Any:
        counts = self.low_counts if side == "up" else self.high_counts
        at = np.flatnonzero(counts)
        values, counts = at / LATTICE, counts[at].astype(np.float64)
        g = 2.0 ** -np.arange(1, self.bets + 1)[:, None]

        def log_wealth(m: float) -> float:
            if not at.size:
                return 0.0
            moves = (values / m - 1.0) if side == "up" else (m - values) / (1.0 - m)
            return float(_log_mean_exp(np.log1p(g * moves[None, :]) @ counts))

        return log_wealth

    def interval(self, alpha: float) -> tuple[float, float]:
        """The ``1 - alpha`` confidence interval of the mean at this time (each side at ``alpha / 2``); ``(0, 1)``
        before any value."""
        alpha = _check_alpha(alpha)
        if self.n == 0:
            return 0.0, 1.0
        level = math.log(2.0 / alpha)
        # the upward wealth falls as m rises, the downward one rises: each bound is one bisection
        low, high = 0.0, 1.0
        up, down = self._wealth_function("up"), self._wealth_function("down")
        if up(1e-12) >= level:
            lo, hi = 1e-12, 1.0 - 1e-12
            for _ in range(34):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if up(mid) >= level else (lo, mid)
            low = hi
        if down(1.0 - 1e-12) >= level:
            lo, hi = 1e-12, 1.0 - 1e-12
            for _ in range(34):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if down(mid) >= level else (mid, hi)
            high = lo
        return low, max(low, high)


class ChangeDetector:
    r"""Sequential test of ``H0: every value's conditional mean is at most target``, checked after every value, with
    false-alarm probability at most ``alpha`` over the whole stream (see the module's docstring for the construction).

    Args:
        target (`float`): the promised mean, in (0, 1).
        alpha (`float`): the false-alarm probability allowed, in (0, 1).
        bets (`int`, *optional*, defaults to 6): bet sizes ``2^-g / target``, ``g = 1..bets``, averaged.
        stride (`int`, *optional*, defaults to 50): a wealth process starts every ``stride`` values.
        horizon (`int`, *optional*): the values a review period is planned to hold: the starts within it weigh more
            (see the module's docstring); the false-alarm bound holds either way, past the horizon too.

    Attributes:
        n (`int`): values seen.
        alarm_at (`int` or `None`): the value (1-based) at which the evidence first reached ``1 / alpha``.
        since (`int` or `None`): where the change began by the evidence at the alarm: the first value of the run (the
            CUSUM statistic of the best bet) that raised it.
        evidence (`float`): the current e-value (the mixture's wealth); ``max_evidence`` is its largest so far.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.monitoring.sequential import ChangeDetector
    >>> rng = np.random.default_rng(0)
    >>> detector = ChangeDetector(target=0.1, alpha=0.05)
    >>> detector.update(rng.random(5_000) < 0.1)  # at the target: no alarm
    >>> detector.alarm_at is None
    True
    >>> detector.update(rng.random(3_000) < 0.3)  # the rate triples at value 5,001
    >>> 5_000 < detector.alarm_at < 5_400, 4_900 < detector.since <= detector.alarm_at
    (True, True)

    ```
    """

    def __init__(self, target: float, alpha: float, bets: int = 6, stride: int = 50, horizon: int | None = None) -> None:
        if not isinstance(target, (int, float)) or isinstance(target, bool) or not 0 < target < 1:
            raise ValueError(f"target must be a number in (0, 1), got {target!r}.")
        self.target = float(target)
        self.alpha = _check_alpha(alpha)
        self.lambdas = 2.0 ** -np.arange(1, int(bets) + 1) / self.target
        for name, value in (("bets", bets), ("stride", stride), ("horizon", horizon)):
            if (value is not None or name != "horizon") and (
                    not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        self.stride = int(stride)
        self.horizon = None if horizon is None else int(horizon)
        g = self.lambdas.size
        self.n = 0
        self._wealth = np.zeros(g)  # log wealth of the process started at value 1, after n values
        self._mixed = np.full(g, -np.inf)  # log sum_{s<=n} w_s exp(-wealth_{s-1})
        self._started = 0.0  # sum_{s<=n} w_s
        self._cusum = np.zeros(g)  # max(0, ...) of each bet's log wealth: the run since the last reset
        self._run_start = np.ones(g, dtype=np.int64)  # the first value of each run
        self.log_evidence = 0.0
        self.max_log_evidence = 0.0
        self.alarm_at: int | None = None
        self.since: int | None = None
        self.alarm_evidence: float | None = None

    def _log_weights(self, positions: np.ndarray) -> np.ndarray:
        on = (positions - 1) % self.stride == 0
        s = ((positions - 1) // self.stride + 1).astype(np.float64)
        if self.horizon is None:
            return np.where(on, -np.log(_WEIGHT_NORM * (s + 1.0) * np.log(s + 1.0) ** 2), -np.inf)
        starts = -(-self.horizon // self.stride)
        late = np.maximum(s - starts, 1.0)
        log_w = np.where(s <= starts, math.log((1.0 - _TAIL) / starts),
                         math.log(_TAIL) - np.log(_WEIGHT_NORM * (late + 1.0) * np.log(late + 1.0) ** 2))
        return np.where(on, log_w, -np.inf)

    @property
    def evidence(self) -> float:
        return math.exp(min(self.log_evidence, 700.0))

    @property
    def max_evidence(self) -> float:
        return math.exp(min(self.max_log_evidence, 700.0))

    @property
    def threshold(self) -> float:
        return 1.0 / self.alpha

    def update(self, values: Any) -> None:
        """Adds values in [0, 1], in the order they came."""
        x = _check_values(values)
        k = x.size
        if k == 0:
            return
        steps = np.log1p(self.lambdas[:, None] * (x[None, :] - self.target))  # [G, k]
        after = self._wealth[:, None] + np.cumsum(steps, axis=1)  # wealth_t for t = n+1..n+k
        before = np.concatenate([self._wealth[:, None], after[:, :-1]], axis=1)  # wealth_{s-1}
        positions = np.arange(self.n + 1, self.n + k + 1)
        log_w = self._log_weights(positions)
        terms = np.concatenate([self._mixed[:, None], log_w[None, :] - before], axis=1)
        mixed = np.logaddexp.accumulate(terms, axis=1)[:, 1:]  # [G, k]
        started = self._started + np.cumsum(np.exp(log_w))
        started_part = _log_mean_exp(after + mixed, axis=0)  # log of the started processes' mixture
        log_e = np.logaddexp(started_part, np.log(np.maximum(1.0 - started, 1e-300)))
        # CUSUM of each bet (for "since when"): R_t = S_t - min(0, min_{u<=t} S_u), S starting at the carried R
        level = self._cusum[:, None] + np.cumsum(steps, axis=1)
        low = np.minimum(np.minimum.accumulate(level, axis=1), 0.0)
        runs = level - low
        reset = np.where(level <= low, positions[None, :] + 1, 0)
        starts = np.maximum(np.maximum.accumulate(reset, axis=1), self._run_start[:, None])
        if self.alarm_at is None:
            crossed = np.flatnonzero(log_e >= math.log(self.threshold))
            if crossed.size:
                i = int(crossed[0])
                self.alarm_at = int(positions[i])
                self.since = int(starts[int(np.argmax(runs[:, i])), i])
                self.alarm_evidence = math.exp(min(float(log_e[i]), 700.0))
        self._wealth, self._mixed, self._started = after[:, -1], mixed[:, -1], float(started[-1])
        self._cusum, self._run_start = runs[:, -1], starts[:, -1]
        self.log_evidence = float(log_e[-1])
        self.max_log_evidence = max(self.max_log_evidence, float(log_e.max()))
        self.n += k
