"""Streams that switch from in-distribution inputs to shifted ones at a known row, watched by hf_defer's
`DeferralMonitor` and by the naive alternative (a test on each fixed window, repeated), for `results/monitoring.md`.

Each stream draws `pre` inputs from the in-distribution population and then `post` from the shifted one (with
replacement: the population is the pool's empirical distribution). The model's threshold and targets are certified
on the calibration inputs ([`certify`]); a stream's promise is broken after the shift when the shifted population's
deferral rate or system error exceeds its target (a *harmful* shift), else the shift is *benign*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import binom, norm

from hf_defer import DeferralMonitor
from hf_defer.evaluation.guarantees import certify_threshold
from .monitoring_data import Population, Setting


@dataclass
class Targets:
    threshold: float
    max_deferral_rate: float
    max_error: float
    confidence: float


def certify(setting: Setting, budget: float, confidence: float) -> Targets:
    """The promises a deployment would be given, each at half of ``1 - confidence`` (Bonferroni): the threshold
    certified on the calibration inputs for the deferral budget (the exact binomial order statistic), and as the
    error target the Clopper-Pearson upper bound of the calibration inputs' system error at that threshold, rounded
    up to 0.01 (the threshold depends on the margins only, the bound on the losses at it)."""
    from scipy.stats import beta

    cal = setting.calibration
    share = 1.0 - (1.0 - confidence) / 2
    threshold = certify_threshold(cal.margin, confidence=share, max_deferral_rate=budget).threshold
    losses = cal.at(threshold)["loss"]
    k, n = int(losses.sum()), losses.size
    upper = float(beta.ppf(share, k + 1, n - k)) if k < n else 1.0
    return Targets(threshold, budget, float(np.ceil(upper * 100) / 100), confidence)


def population_values(population: Population, targets: Targets) -> dict[str, float]:
    at = population.at(targets.threshold)
    return {"deferral_rate": float(at["deferred"].mean()), "system_error": float(at["loss"].mean()),
            "estimated_error": float(at["estimated"].mean()), "classifier_error": float(population.loss_kept.mean())}


def _outputs(rows: dict[str, np.ndarray], cs: np.ndarray, es: np.ndarray, name: str) -> tuple[list, list, list]:
    """Pipeline-shaped outputs of a batch (class "y" is always the truth; a wrong answer says "n")."""
    outputs, labels, answers = [], [], []
    for d, loss, c, e in zip(rows["deferred"], rows["loss"], cs, es):
        outputs.append({"defer": bool(d), "expert": name if d else None,
                        "class_label": "n" if (not d and loss) else "y", "class_score": float(c),
                        "expert_scores": {name: float(e)}})
        labels.append("y")
        answers.append(("n" if loss else "y") if d else None)
    return outputs, labels, answers


def _naive_first_alarm(deferred: np.ndarray, estimated: np.ndarray, targets: Targets, window: int, level: float,
                       labelled: np.ndarray | None, labelled_target: float | None) -> int | None:
    """The end row of the first fixed window where a one-window test at `level` rejects: the exact binomial test of
    the deferral rate against its budget, a one-sided z-test of the estimated error against the error target (a mean
    of 250 values in [0, 1]: the normal approximation holds), and for the audit-weighted error, whose values are
    mostly 0 (a z-test would reject far too often), the exact binomial test of ``Bernoulli(value)`` draws (`labelled`
    holds them: same mean, so the test keeps its level)."""
    for end in range(window, len(deferred) + 1, window):
        part = slice(end - window, end)
        if binom.sf(deferred[part].sum() - 1, window, targets.max_deferral_rate) <= level:
            return end
        values = estimated[part]
        sd = max(float(values.std(ddof=1)), 1e-9)
        if norm.sf((values.mean() - targets.max_error) / (sd / np.sqrt(window))) <= level:
            return end
        if labelled is not None and binom.sf(labelled[part].sum() - 1, window, labelled_target) <= level:
            return end
    return None


def reference_rows(setting: Setting, targets: Targets) -> tuple[list, list, list]:
    """The calibration inputs as `DeferralMonitor.recalibrate` takes them: the outputs at the certified threshold,
    the labels, and on the deferred rows the expert's answer (right or wrong: the calibration inputs' truth)."""
    cal = setting.calibration
    at = cal.at(targets.threshold)
    name = setting.expert_names[0]
    outputs = [{"defer": bool(d), "expert": name if d else None, "class_label": "n" if lk else "y",
                "class_score": float(c), "expert_scores": {name: float(e)}}
               for d, lk, c, e in zip(at["deferred"], cal.loss_kept, cal.class_score, cal.expert_score)]
    answers = [("n" if ld else "y") if d else None for d, ld in zip(at["deferred"], cal.loss_deferred)]
    return outputs, ["y"] * len(outputs), answers


def recalibrated_estimates(setting: Setting, label: str, targets: Targets, monitor: DeferralMonitor) -> np.ndarray:
    """The recalibrated label-free estimate of every input of a population (by a recalibrated monitor)."""
    population = setting.populations[label]
    at = population.at(targets.threshold)
    outputs, _, _ = _outputs(at, population.class_score, population.expert_score, setting.expert_names[0])
    return monitor.estimated_errors(outputs)


def run_streams(setting: Setting, before: str, after: str, targets: Targets, *, streams: int, pre: int, post: int,
                batch: int = 50, window: int = 250, audit_rate: float = 0.1, seed: int = 0,
                keep_rows: int = 0, followup: bool = False) -> dict[str, Any]:
    """`streams` streams of `pre` inputs of population `before` then `post` of `after`, each watched by a
    `DeferralMonitor` (fed `batch` decisions at a time, the labels of the rows it draws arriving with them) and by
    the naive window tests (unadjusted, at the monitor's per-test level, and Bonferroni-adjusted over the stream's
    windows). Returns per stream the first alarm of each, the channel that raised it, and the label-free estimate
    and the truth per window; the rows of the first `keep_rows` streams are kept for CBPE."""
    name = setting.expert_names[0]
    a = setting.populations[before].at(targets.threshold)
    b = setting.populations[after].at(targets.threshold)
    cs = (setting.populations[before].class_score, setting.populations[after].class_score)
    es = (setting.populations[before].expert_score, setting.populations[after].expert_score)
    length = pre + post
    windows = length // window
    results: dict[str, Any] = {"alarm": [], "channel": [], "since": [], "naive": [], "naive_bonferroni": [],
                               "estimate": [], "truth": [], "kept_rows": [], "alarm_horizon": [],
                               "channel_horizon": [], "estimate_recalibrated": [], "recalibration": None}
    reference = reference_rows(setting, targets) if followup else None
    if followup:
        template = DeferralMonitor([name]).recalibrate(reference[0], reference[1], expert_answers=reference[2])
        recalibrated = (recalibrated_estimates(setting, before, targets, template),
                        recalibrated_estimates(setting, after, targets, template))
    for s in range(streams):
        rng = np.random.default_rng([seed, s])
        i, j = rng.integers(len(a["loss"]), size=pre), rng.integers(len(b["loss"]), size=post)
        rows = {key: np.concatenate([a[key][i], b[key][j]]) for key in ("deferred", "loss", "estimated")}
        class_score, expert_score = np.concatenate([cs[0][i], cs[1][j]]), np.concatenate([es[0][i], es[1][j]])
        monitors = [DeferralMonitor([name], confidence=targets.confidence, max_deferral_rate=targets.max_deferral_rate,
                                    max_error=targets.max_error, audit_rate=audit_rate, seed=s,
                                    horizon=horizon) for horizon in ((None, length) if followup else (None,))]
        if followup:
            for monitor in monitors:
                monitor._maps = template._maps  # the same isotonic maps (fitted once, on the same rows)
        monitor = monitors[0]
        drawn = np.zeros(length, dtype=bool)
        for start in range(0, length, batch):
            part = {key: value[start:start + batch] for key, value in rows.items()}
            outputs, labels, answers = _outputs(part, class_score[start:start + batch],
                                                expert_score[start:start + batch], name)
            for m in monitors[1:]:
                m.update(outputs, ids=[str(r) for r in range(start, start + len(outputs))], labels=labels,
                         expert_answers=answers)
            asked = monitor.update(outputs, ids=[str(r) for r in range(start, start + len(outputs))], labels=labels,
                                   expert_answers=answers)
            drawn[[int(r) for r in asked]] = True
        alarm = monitor.alarm
        results["alarm"].append(None if alarm is None else alarm["raised_at_row"])
        results["channel"].append(None if alarm is None else alarm["channel"])
        results["since"].append(None if alarm is None else alarm["since_row"])
        if followup:
            other = monitors[1].alarm
            results["alarm_horizon"].append(None if other is None else other["raised_at_row"])
            results["channel_horizon"].append(None if other is None else other["channel"])
            est = np.concatenate([recalibrated[0][i], recalibrated[1][j]])[:windows * window]
            results["estimate_recalibrated"].append(est.reshape(windows, window).mean(axis=1))
        # the naive tests see the same rows, the same audit draw and the same weights
        weight = np.where(rows["deferred"], audit_rate, 1.0)
        labelled = rng.random(length) < np.where(drawn, rows["loss"] * weight, 0.0)  # Bernoulli(value) draws
        level = monitor.alpha
        results["naive"].append(_naive_first_alarm(rows["deferred"], rows["estimated"], targets, window, level,
                                                   labelled, targets.max_error * audit_rate))
        results["naive_bonferroni"].append(_naive_first_alarm(rows["deferred"], rows["estimated"], targets, window,
                                                              level / windows, labelled,
                                                              targets.max_error * audit_rate))
        results["estimate"].append(rows["estimated"][:windows * window].reshape(windows, window).mean(axis=1))
        results["truth"].append(rows["loss"][:windows * window].reshape(windows, window).mean(axis=1))
        if s < keep_rows:
            results["kept_rows"].append({"p": 1.0 - rows["estimated"], "y": 1.0 - rows["loss"]})
    results["estimate"], results["truth"] = np.array(results["estimate"]), np.array(results["truth"])
    results["estimate_recalibrated"] = np.array(results["estimate_recalibrated"])
    if followup:  # the maps' tests, and the calibration inputs' system error against the model's estimate of it
        at = setting.calibration.at(targets.threshold)
        results["recalibration"] = {**template.recalibration, "reference_error": float(at["loss"].mean()),
                                    "reference_estimated": float(at["estimated"].mean())}
    return results


def summarize(results: dict[str, Any], pre: int, harmful: bool) -> dict[str, Any]:
    """False alarms (an alarm before the shift, or at all on a benign stream), detection and its delay."""
    out: dict[str, Any] = {}
    n = len(results["alarm"])
    for key in ("alarm", "naive", "naive_bonferroni") + (("alarm_horizon",) if results.get("alarm_horizon") else ()):
        first = [np.inf if row is None else row for row in results[key]]
        first = np.asarray(first, dtype=np.float64)
        before = first <= pre
        entry = {"false_alarm_before_shift": float(before.mean()), "no_alarm": float(np.isinf(first).mean())}
        if harmful:
            detected = ~before & np.isfinite(first)
            delays = first[detected] - pre
            entry.update(detected=float(detected.mean()),
                         median_delay=float(np.median(delays)) if delays.size else None,
                         mean_delay=float(delays.mean()) if delays.size else None)
        else:
            entry["any_alarm"] = float(np.isfinite(first).mean())
        out[key] = entry
    channels: dict[str, int] = {}
    for channel in results["channel"]:
        if channel is not None:
            channels[channel] = channels.get(channel, 0) + 1
    out["alarm_channels"] = channels
    out["streams"] = n
    return out
