"""[`DeferralMonitor`]: a deferral model's promises watched in deployment, from the pipeline's outputs (and the labels
that arrive later for some of them), with anytime-valid bounds and an alarm.

What it watches (each a *channel*; the statistics are in `sequential.py`):

* ``deferral_rate`` and ``deferral_rate[<expert>]``: the share of inputs deferred, overall and to each expert.
* ``estimated_error``: the system error the model itself expects, without labels: ``1 - class_score`` where the
  classifier answers, ``1 - a_j`` (the chosen expert's estimated accuracy) where it defers; for a route-only model
  ``1 - estimated_accuracy`` of the chosen expert (the way NannyML's CBPE estimates accuracy from calibrated scores).
  Its bound is on the *expected estimated* error: it equals the true error only while the model's estimates stay
  calibrated, which a shift may break; the labelled channel below needs no such assumption. After
  [`~DeferralMonitor.recalibrate`] (labelled reference rows, as CBPE's reference set) the chances are first mapped by
  isotonic regressions fitted there, where a calibration test rejects the raw ones; the bound is then on the expected
  recalibrated estimate.
* ``system_error`` (with labels): the true system error. Deferred inputs are all labelled (the reviewers' answers),
  the inputs the model keeps only on a random audit share ``audit_rate`` that the monitor draws (seeded); each label
  is weighted by the inverse of its chance to be asked for (Horvitz-Thompson), so the estimate is unbiased for the
  whole stream. With ``audit_rate=0`` only the deferred inputs' errors count: a lower bound on the system error, so
  its alarm is still never false more often than stated, but it is blind to the classifier's own errors.
* ``mean_cost``: the mean price per input (each deferred input costs its expert's price), when a cost budget was
  certified.

A channel with a target (the model's certified budget, error target or cost budget) raises an alarm when the
sequential test ([`ChangeDetector`]) finds, with the stated confidence, that its mean has risen above the target.
``1 - confidence`` is split equally among those channels (a union bound), so the probability that *any* alarm is ever
raised while every promise holds is at most ``1 - confidence``, however long the stream and however often it is
looked at. Each channel's interval ([`BettingConfidenceSequence`]) is at the same share.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..modeling.guarantee_record import DeferralGuarantee
from ..modeling.validators import check_share
from .sequential import BettingConfidenceSequence, ChangeDetector

__all__ = ["DeferralMonitor", "monitor_for"]


class _Channel:
    """One monitored mean: values in [0, 1] (``scale`` times the quantity reported) and, with a target, its test."""

    def __init__(self, name: str, alpha: float, target: float | None = None, scale: float = 1.0,
                 what: str = "", top: float = 1.0, horizon: int | None = None) -> None:
        self.name, self.alpha, self.target, self.scale, self.what, self.top = name, alpha, target, scale, what, top
        self.sequence = BettingConfidenceSequence()
        scaled = None if target is None else target * scale
        self.detector = None if scaled is None or scaled >= 1 else ChangeDetector(scaled, alpha, horizon=horizon)
        self.raised_at: str | None = None

    def update(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        self.sequence.update(values)
        if self.detector is not None:
            before = self.detector.alarm_at
            self.detector.update(values)
            if before is None and self.detector.alarm_at is not None:
                self.raised_at = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def alarm(self) -> dict[str, Any] | None:
        d = self.detector
        if d is None or d.alarm_at is None:
            return None
        return {
            "channel": self.name, "target": self.target, "since_row": d.since, "raised_at_row": d.alarm_at,
            "raised_at": self.raised_at, "evidence": d.alarm_evidence, "threshold": d.threshold,
            "false_alarm_probability": self.alpha,
            "message": (f"{self.name} ({self.what}) rose above its target {self.target:g}: the change began near row "
                        f"{d.since}, the alarm was raised at row {d.alarm_at} (e-value {d.alarm_evidence:.3g} >= "
                        f"1/alpha = {d.threshold:.3g}; the chance of such an alarm while the target holds is at "
                        f"most {self.alpha:.3g})."),
        }

    def state(self) -> dict[str, Any]:
        s = self.sequence
        low, high = s.interval(self.alpha)
        d = self.detector
        return {
            "what": self.what, "n": s.n, "mean": None if s.mean is None else s.mean / self.scale,
            "lower": low / self.scale, "upper": min(self.top, high / self.scale), "confidence": 1.0 - self.alpha,
            "target": self.target,
            "evidence": None if d is None else d.evidence, "threshold": None if d is None else d.threshold,
            "alarm": self.alarm(),
        }


def _config_of(model: Any) -> Any:
    if isinstance(model, (str, os.PathLike)):
        from ..modeling.configuration_deferral import DeferralConfig

        return DeferralConfig.from_pretrained(model)
    if getattr(model, "model_type", None) == "deferral" and hasattr(model, "expert_names"):
        return model  # a config
    config = getattr(getattr(model, "model", model), "config", None)  # a pipeline or a model
    if getattr(config, "model_type", None) != "deferral":
        raise ValueError(f"model must be a deferral model, pipeline, config or saved folder, got "
                         f"{type(model).__name__}.")
    return config


class DeferralMonitor:
    r"""Watches a deferral model's promises on the stream of its decisions (see the module's docstring).

    Build it from a calibrated model with [`~DeferralMonitor.from_model`] (its ``config.deferral_guarantee`` gives
    the targets and the confidence), or with the targets given here. Feed it the pipeline's outputs, batch by batch,
    with [`~DeferralMonitor.update`]; labels that arrive later go in with ``update(labels={id: label})``.

    Args:
        expert_names (sequence of `str`): the model's experts (`config.expert_names`).
        confidence (`float`, *optional*, defaults to 0.9): the probability, over the whole stream, that no alarm is
            raised while every promise holds; ``1 - confidence`` is split equally among the channels with a target.
        max_deferral_rate (`float` or `dict`, *optional*): the deferral budget, or one per expert.
        max_error (`float`, *optional*): the system error target (the ``estimated_error`` and ``system_error``
            channels are tested against it).
        max_mean_cost (`float`, *optional*): the budget on the mean price per input.
        expert_costs (sequence of `float`, *optional*): each expert's price (needed with ``max_mean_cost``).
        cost_bound (`float`, *optional*): the largest price an input can have (default: the largest given).
        audit_rate (`float`, *optional*): the share of the inputs the model keeps that are drawn for a label (an
            audit), in [0, 1]; `None` (default): no labels are expected and no ``system_error`` channel exists.
        seed (`int`, *optional*, defaults to 0): seeds the audit draw.
        id2label (`dict`, *optional*): class ids to names, so that labels may be given as ids.
        horizon (`int`, *optional*): the rows a review period is planned to hold: changes within it are caught
            sooner (the alarm's start rows within it weigh more; see `hf_defer.monitoring.sequential`). The
            false-alarm bound holds either way, past the horizon too.

    Example:

    ```python
    >>> from hf_defer import DeferralMonitor
    >>> monitor = DeferralMonitor(["alice"], confidence=0.9, max_deferral_rate=0.2, max_error=0.2, audit_rate=0.5)
    >>> kept = {"defer": False, "expert": None, "class_label": "yes", "class_score": 0.9,
    ...         "expert_scores": {"alice": 0.7}}
    >>> deferred = {"defer": True, "expert": "alice", "class_label": "no", "class_score": 0.6,
    ...             "expert_scores": {"alice": 0.95}}
    >>> to_label = monitor.update([kept, deferred, kept, kept], ids=["a", "b", "c", "d"])
    >>> "b" in to_label  # a deferred input is always labelled; kept ones with probability audit_rate
    True
    >>> round(monitor.state()["channels"]["estimated_error"]["mean"], 4)  # (0.1 + 0.05 + 0.1 + 0.1) / 4
    0.0875
    >>> monitor.alarm is None
    True

    ```
    """

    def __init__(self, expert_names: Sequence[str], *, confidence: float = 0.9,
                 max_deferral_rate: float | Mapping[str, float] | None = None, max_error: float | None = None,
                 max_mean_cost: float | None = None, expert_costs: Sequence[float] | None = None,
                 cost_bound: float | None = None, audit_rate: float | None = None, seed: int = 0,
                 id2label: Mapping[Any, str] | None = None, horizon: int | None = None) -> None:
        self.expert_names = [str(name) for name in expert_names]
        if not self.expert_names:
            raise ValueError("expert_names is empty: a deferral model has at least one expert.")
        self.confidence = check_share(confidence, "confidence", closed_top=False)
        rates: dict[str | None, float] = {}
        if isinstance(max_deferral_rate, Mapping):
            unknown = sorted(set(max_deferral_rate) - set(self.expert_names))
            if unknown:
                raise ValueError(f"max_deferral_rate names {unknown}, which are not among the experts "
                                 f"{self.expert_names}.")
            rates = {str(k): check_share(v, f"max_deferral_rate[{k!r}]") for k, v in max_deferral_rate.items()}
        elif max_deferral_rate is not None:
            rates = {None: check_share(max_deferral_rate, "max_deferral_rate")}
        self.max_error = None if max_error is None else check_share(max_error, "max_error")
        if audit_rate is not None and (not isinstance(audit_rate, (int, float)) or isinstance(audit_rate, bool)
                                       or not 0 <= audit_rate <= 1):
            raise ValueError(f"audit_rate must be a share in [0, 1] (or None: no labels), got {audit_rate!r}.")
        self.audit_rate = None if audit_rate is None else float(audit_rate)
        self.expert_costs = None if expert_costs is None else [float(c) for c in expert_costs]
        if self.expert_costs is not None and (len(self.expert_costs) != len(self.expert_names)
                                              or any(not c >= 0 for c in self.expert_costs)):
            raise ValueError(f"expert_costs must be {len(self.expert_names)} non-negative numbers (one per expert), "
                             f"got {expert_costs!r}.")
        self.cost_bound = None
        if max_mean_cost is not None:
            if not self.expert_costs or max(self.expert_costs) <= 0:
                raise ValueError("max_mean_cost needs expert_costs (each expert's price), some above 0.")
            self.cost_bound = float(cost_bound if cost_bound is not None else max(self.expert_costs))
            if not self.cost_bound >= max(self.expert_costs):
                raise ValueError(f"cost_bound must be at least every expert's cost, got {cost_bound!r}.")
            if not isinstance(max_mean_cost, (int, float)) or not max_mean_cost > 0:
                raise ValueError(f"max_mean_cost must be a positive number, got {max_mean_cost!r}.")
        self.id2label = {str(k): str(v) for k, v in (id2label or {}).items()}
        self._rng = np.random.default_rng(seed)
        if horizon is not None and (not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1):
            raise ValueError(f"horizon must be a positive whole number of rows (or None), got {horizon!r}.")
        self.horizon = horizon
        self.recalibration: dict[str, Any] | None = None  # set by recalibrate()
        self._maps: dict[str, tuple[np.ndarray, np.ndarray]] = {}

        targets = len(rates) + 2 * (self.max_error is not None and self.audit_rate is not None) + (
            self.max_error is not None and self.audit_rate is None) + (max_mean_cost is not None)
        self.tests = max(1, targets)
        self.alpha = (1.0 - self.confidence) / self.tests
        a = self.alpha
        self.channels: dict[str, _Channel] = {
            "deferral_rate": _Channel("deferral_rate", a, rates.get(None), what="share of inputs deferred",
                                      horizon=horizon)}
        for name in self.expert_names:
            self.channels[f"deferral_rate[{name}]"] = _Channel(f"deferral_rate[{name}]", a, rates.get(name),
                                                               what=f"share of inputs deferred to {name}",
                                                               horizon=horizon)
        self.channels["estimated_error"] = _Channel("estimated_error", a, self.max_error,
                                                    what="system error the model expects, without labels",
                                                    horizon=horizon)
        self._audit_scale = 1.0
        if self.audit_rate is not None:
            self._audit_scale = self.audit_rate if self.audit_rate > 0 else 1.0
            self.channels["system_error"] = _Channel(
                "system_error", a, self.max_error, scale=self._audit_scale,
                what="true system error, from the labels" + (" of deferred inputs only (a lower bound)"
                                                             if self.audit_rate == 0 else ", audit-weighted"),
                horizon=horizon)
        if max_mean_cost is not None:
            self.channels["mean_cost"] = _Channel("mean_cost", a, float(max_mean_cost), scale=1.0 / self.cost_bound,
                                                  what="mean price per input", top=self.cost_bound,
                                                  horizon=horizon)
        self.rows = 0
        self.labels_ignored = 0
        self._queue: deque[list[Any]] = deque()  # [row, value or None] for the labelled channel, in row order
        self._pending: dict[str, dict[str, Any]] = {}  # id -> what its label is needed for
        self.guarantee: dict[str, Any] | None = None

    @classmethod
    def from_model(cls, model: Any, *, confidence: float | None = None, audit_rate: float | None = None,
                   seed: int = 0, horizon: int | None = None, reference: Any = None) -> "DeferralMonitor":
        """The monitor of a calibrated model's promises (``config.deferral_guarantee``, written by
        [`calibrate_deferral`] with a confidence).

        Args:
            model: a deferral model, its pipeline, its config, or a saved folder (only `config.json` is read).
            confidence (`float`, *optional*): of the alarm; defaults to the guarantee's own.
            audit_rate / seed / horizon: as in [`DeferralMonitor`].
            reference (`tuple`, `dict` or `datasets.Dataset`, *optional*): labelled reference rows to recalibrate
                the label-free estimate on, ``(outputs, labels)`` or ``(outputs, labels, expert_answers)`` or a dict
                with those keys: the pipeline's outputs on the calibration inputs (or a decision log's rows) and
                what happened there (see [`~DeferralMonitor.recalibrate`]); or a dataset of those outputs (a
                decision log read with `datasets`) with the true labels in a ``labels`` column and, where deferred,
                the expert's answer in an ``expert_answers`` column.

        Promises it cannot watch from decisions are listed in ``state()["not_monitored"]`` (a selective error
        target: the classifier's error among the inputs it keeps).
        """
        config = _config_of(model)
        guarantee = DeferralGuarantee.from_config(config)
        if guarantee is None:
            raise ValueError("the model has no deferral guarantee (config.deferral_guarantee): calibrate it with a "
                             "confidence (calibrate_deferral(..., confidence=0.9) or hf-defer calibrate --confidence), "
                             "or build DeferralMonitor(expert_names, max_deferral_rate=...) with the targets.")
        if guarantee.expected and confidence is None:  # guarantee="expected": no confidence of its own to reuse
            raise ValueError("the model's guarantee bounds the expected error (guarantee='expected'), with no "
                             "confidence: give the alarm's own, e.g. confidence=0.9.")
        rates: dict[str, float] = {}
        total = max_error = max_cost = cost_bound = None
        skipped = []
        for claim in guarantee.claims:
            kind = claim.get("kind")
            if kind == "deferral_rate" and "expert" in claim:
                rates[claim["expert"]] = float(claim["target"])
            elif kind == "deferral_rate":
                total = float(claim["target"])
            elif kind == "system_error":
                max_error = float(claim["target"])
            elif kind == "mean_cost" and claim.get("confidence", 0) < 1:
                max_cost, cost_bound = float(claim["target"]), claim.get("cost_bound")
            else:
                skipped.append(kind)
        if total is not None and rates:
            raise ValueError("the guarantee holds both a total and per-expert budgets; give them to DeferralMonitor "
                             "yourself.")
        monitor = cls(list(config.expert_names), confidence=guarantee.confidence if confidence is None
                      else confidence, max_deferral_rate=rates or total, max_error=max_error,
                      max_mean_cost=max_cost, expert_costs=guarantee.expert_costs or getattr(
                          config, "expert_costs", None), cost_bound=cost_bound, audit_rate=audit_rate, seed=seed,
                      id2label=getattr(config, "id2label", None), horizon=horizon)
        monitor.guarantee = guarantee.to_dict()
        monitor.not_monitored = skipped
        if reference is not None:
            if isinstance(reference, Mapping):
                unknown = sorted(set(reference) - {"outputs", "labels", "expert_answers"})
                if unknown or not {"outputs", "labels"} <= set(reference):
                    raise ValueError(f"reference must hold outputs, labels and optionally expert_answers, got keys "
                                     f"{sorted(reference)}.")
                monitor.recalibrate(reference["outputs"], reference["labels"],
                                    expert_answers=reference.get("expert_answers"))
            elif isinstance(reference, (tuple, list)) and len(reference) in (2, 3):
                monitor.recalibrate(reference[0], reference[1],
                                    expert_answers=reference[2] if len(reference) == 3 else None)
            elif isinstance(getattr(reference, "column_names", None), list):  # a datasets.Dataset
                columns = reference.column_names
                if "labels" not in columns:
                    raise ValueError("reference, a dataset, must hold the outputs' columns (a decision log's) and the "
                                     f"true labels as a `labels` column (and `expert_answers`), got columns {columns}.")
                answers = reference["expert_answers"] if "expert_answers" in columns else None
                outputs = reference.remove_columns([c for c in ("labels", "expert_answers") if c in columns])
                monitor.recalibrate(outputs, reference["labels"], expert_answers=answers)
            else:
                raise ValueError("reference must be (outputs, labels), (outputs, labels, expert_answers), a dict "
                                 "with those keys or a datasets.Dataset of outputs with `labels` (and "
                                 f"`expert_answers`) columns, got {type(reference).__name__}.")
        return monitor

    not_monitored: list[str] = []

    def recalibrate(self, outputs: Sequence[Mapping[str, Any]], labels: Sequence[Any], *,
                    expert_answers: Sequence[Any] | None = None, min_rows: int = 10,
                    level: float | None = 0.05) -> "DeferralMonitor":
        """Recalibrates the label-free estimate on labelled reference rows (the calibration inputs, or any labelled
        set from the population the targets were certified on), as NannyML's CBPE does: an isotonic regression
        (scikit-learn's ``IsotonicRegression``, a monotone map fitted to what happened) of whether the classifier
        was right on its ``class_score``, and of whether each expert was right on its estimated accuracy; a
        route-only model's ``estimated_accuracy`` against its 0/1 labels. Each map is fitted on the rows where the
        estimate uses it: the classifier's on the rows it keeps, an expert's on the rows deferred to it (the
        selection matters: among the rows it keeps, the classifier is surer and more often right). The
        ``estimated_error`` channel is then fed the recalibrated chances. Call it before the first
        [`~DeferralMonitor.update`].

        A map is kept only where the reference rows show that the raw estimates are miscalibrated there: Cox's
        calibration test (Cox, Biometrika 1958), the likelihood-ratio test of
        ``logit P(right) = a + b logit(estimate)`` against ``a = 0, b = 1`` (the raw estimates as they are), chi-squared with 2 degrees of freedom (1 when
        all the rows share one estimate: the intercept alone), rejects at ``level``. The raw estimates are not fitted
        on the reference rows, so the test needs no held-out rows, and its chance to replace calibrated estimates by
        a fitted map is ``level`` (the chi-squared law is the large-sample one). It looks at what the monitor uses: the intercept is the calibration of the
        mean (what a window's estimate sums), the slope whether the estimates stay right where the traffic moves to
        surer or less sure inputs. On a few dozen rows (a small calibration set's deferred inputs) an isotonic fit is
        mostly noise and the test rarely rejects: those estimates stay raw. ``recalibration["tests"]`` gives each
        test's statistic, p-value and fitted ``a`` and ``b``.

        The alarm's validity does not depend on it: the channel's bound and test are on the mean of the
        recalibrated estimate, whatever map was fitted (it is fixed before the stream). That it tracks the true
        error is an assumption, as for the raw estimate: the map corrects the model's miscalibration on the
        reference population, not what a shift does to it. The labelled ``system_error`` channel needs neither.

        Args:
            outputs (list of `dict` or `datasets.Dataset`): the pipeline's outputs on the reference rows (or a
                decision log's rows).
            labels (sequence): each row's true label (class names, or ids with ``id2label``; `None` where unknown);
                for a route-only model whether the chosen expert was right (1/0).
            expert_answers (sequence, *optional*): per row, the answer of the expert it was deferred to (`None` on
                kept rows or where unknown; a model expert's answer is read from the output's ``label``).
            min_rows (`int`, *optional*, defaults to 10): a map is fitted only from at least this many rows (and
                both outcomes); the others stay raw (``recalibration`` says which).
            level (`float`, *optional*, defaults to 0.05): the level of the calibration test above; `None` keeps
                every map that could be fitted, untested.

        Returns:
            The monitor (recalibrated in place). ``recalibration`` holds the rows each map was fitted on, the sources
            left raw, the level and each calibration test.

        Example:

        ```python
        >>> from hf_defer import DeferralMonitor
        >>> monitor = DeferralMonitor(["alice"])
        >>> reference = [{"defer": False, "expert": None, "class_label": "y", "class_score": score,
        ...               "expert_scores": {"alice": 0.8}} for score in (0.6, 0.7, 0.8, 0.9)]
        >>> _ = monitor.recalibrate(reference, ["y", "n", "y", "y"], min_rows=4, level=None)  # 1, 0, 1, 1
        >>> monitor.estimated_errors([{**reference[0], "class_score": 0.75}]).round(4).tolist()  # 1 - (0.5 + 1) / 2
        [0.25]

        ```
        """
        if self.rows:
            raise ValueError("recalibrate the monitor before its first update: the estimated_error channel has "
                             f"already been fed {self.rows} raw estimates.")
        try:
            from sklearn.isotonic import IsotonicRegression
        except ImportError:  # pragma: no cover - scikit-learn comes with the guarantees extra (mapie)
            raise ImportError("recalibrate needs scikit-learn: pip install 'hf-defer[guarantees]'.") from None
        outputs = list(outputs)
        labels = list(labels)
        answers = [None] * len(outputs) if expert_answers is None else list(expert_answers)
        if len(labels) != len(outputs) or len(answers) != len(outputs):
            raise ValueError(f"recalibrate got {len(outputs)} outputs, {len(labels)} labels and {len(answers)} "
                             "expert_answers: give one of each per reference row.")
        pairs: dict[str, tuple[list[float], list[float]]] = {}

        def add(key: str, chance: float, right: float) -> None:
            xs, ys = pairs.setdefault(key, ([], []))
            xs.append(chance)
            ys.append(right)

        for i, (out, label, answer) in enumerate(zip(outputs, labels, answers)):
            deferred, chosen, error = self._read(out, i)
            if label is None:
                continue
            if "estimated_accuracy" in out and "class_score" not in out:
                if label not in (0, 1, 0.0, 1.0, True, False):
                    raise ValueError(f"labels[{i}] must be 1 (the chosen expert was right) or 0 for a route-only "
                                     f"model, got {label!r}.")
                add("route", 1.0 - error, float(label))
                continue
            if not deferred:  # each map is fitted on the rows where the estimate uses it
                add("classifier", float(out["class_score"]),
                    float(self._name(out["class_label"]) == self._name(label)))
                continue
            if answer is None and out.get("answered_by") not in (None, "classifier") and out.get("label") not in (
                    None, "defer"):
                answer = out["label"]  # a model expert answered
            if answer is not None:
                expert = self.expert_names[chosen]
                add(f"expert:{expert}", float(_expert_scores(out, self.expert_names)[expert]),
                    float(self._name(answer) == self._name(label)))
        if level is not None and not (isinstance(level, (int, float)) and not isinstance(level, bool)
                                      and 0 < level < 1):
            raise ValueError(f"level must be a test level in (0, 1) (or None: keep every map), got {level!r}.")
        maps, fitted, tests = {}, {}, {}
        for key, (xs, ys) in sorted(pairs.items()):
            if len(xs) < min_rows or len(set(ys)) < 2:
                continue
            x, y = np.asarray(xs), np.asarray(ys)
            if level is not None:
                tests[key] = _calibration_test(x, y)
                if not tests[key]["p_value"] < level:
                    continue
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y)
            maps[key] = (np.asarray(iso.X_thresholds_, dtype=np.float64), np.asarray(iso.y_thresholds_,
                                                                                     dtype=np.float64))
            fitted[key] = len(xs)
        self._maps = maps
        self.recalibration = {"fitted_on_rows": fitted, "raw": sorted(set(pairs) - set(maps)), "level": level,
                              "tests": tests}
        return self

    # -- feeding it ----------------------------------------------------------------------------------------------

    def update(self, outputs: Sequence[Mapping[str, Any]] = (), *, ids: Sequence[Any] | None = None,
               labels: Sequence[Any] | Mapping[Any, Any] | None = None,
               expert_answers: Sequence[Any] | Mapping[Any, Any] | None = None,
               audited: Sequence[bool] | None = None) -> list[str]:
        """Adds a batch of the pipeline's outputs (in the order they were decided) and any labels that arrived.

        Args:
            outputs (list of `dict`): the deferral pipeline's outputs (``defer``, ``expert``, ``class_label``,
                ``class_score``, ``expert_scores``; a route-only model's ``estimated_accuracy`` instead of the
                class), or rows of a decision log with those keys.
            ids (sequence, *optional*): one id per output (default: the running row number, from 0, as a string).
            labels (sequence or `dict`, *optional*): the true labels: one per output (`None` where not known yet),
                or ``{id: label}`` for any row seen so far. Class names, or ids when the monitor knows ``id2label``;
                for a route-only model, whether the chosen expert was right (1/0). Needs ``audit_rate``.
            expert_answers (sequence or `dict`, *optional*): the expert's answer on deferred rows, to compare with
                the label (a model expert's answer is read from the output's ``label``). A deferred row labelled
                without the expert's answer is an error: when the reviewer's answer is final, give it as both.
            audited (sequence of `bool`, *optional*): which kept rows of this batch were drawn for an audit, when
                the caller drew them (each independently with probability ``audit_rate``, e.g. a decision log
                audited before it reached the monitor); by default the monitor draws them.

        Returns:
            `list[str]`: the ids of this batch's rows whose labels the ``system_error`` channel needs (every
            deferred row and the audited kept rows; empty without ``audit_rate``).
        """
        outputs = list(outputs)
        first = self.rows
        if ids is None:
            ids = [str(first + i) for i in range(len(outputs))]
        else:
            ids = [str(i) for i in ids]
            if len(ids) != len(outputs):
                raise ValueError(f"ids has {len(ids)} entries for {len(outputs)} outputs.")
            if len(set(ids)) != len(ids) or set(ids) & set(self._pending):
                raise ValueError("ids must be unique among the rows awaiting labels; got a repeated one.")
        deferred, chosen, estimated = self._read_all(outputs, first)
        costs = None
        if "mean_cost" in self.channels:
            costs = np.where(chosen >= 0, np.asarray(self.expert_costs)[np.maximum(chosen, 0)], 0.0)
            costs = np.where(deferred, costs, 0.0)
        to_label: list[str] = []
        if self.audit_rate is not None:
            if audited is None:
                audited = self._rng.random(len(outputs)) < self.audit_rate
            else:
                audited = np.asarray(audited, dtype=bool).reshape(-1)
                if audited.shape != (len(outputs),):
                    raise ValueError(f"audited has {audited.size} entries for {len(outputs)} outputs.")
                if self.audit_rate == 0 and (audited & ~deferred).any():
                    raise ValueError("audited marks kept rows, but audit_rate is 0: give the rate they were drawn at.")
            audited = audited & ~deferred
            for i, out in enumerate(outputs):
                if deferred[i] or audited[i]:
                    entry = [first + i, None]
                    self._pending[ids[i]] = {"entry": entry, "output": out, "deferred": bool(deferred[i]),
                                             "weight": self._audit_scale if deferred[i] else 1.0, "row": first + i}
                    to_label.append(ids[i])
                else:
                    entry = [first + i, 0.0]
                self._queue.append(entry)
        self.rows += len(outputs)
        self.channels["deferral_rate"].update(deferred.astype(np.float64))
        for j, name in enumerate(self.expert_names):
            self.channels[f"deferral_rate[{name}]"].update((deferred & (chosen == j)).astype(np.float64))
        self.channels["estimated_error"].update(estimated)
        if costs is not None:
            self.channels["mean_cost"].update(costs / self.cost_bound)
        if labels is not None or expert_answers is not None:
            self._label(labels, expert_answers, ids)
        self._drain()
        return to_label

    def estimated_errors(self, outputs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """The label-free estimated error of each output (recalibrated after [`~DeferralMonitor.recalibrate`]): what
        the ``estimated_error`` channel is fed. Reads the outputs only; the monitor's state does not change.

        Example:

        ```python
        >>> from hf_defer import DeferralMonitor
        >>> monitor = DeferralMonitor(["alice"])
        >>> monitor.estimated_errors([{"defer": True, "expert": "alice", "class_label": "no", "class_score": 0.6,
        ...                            "expert_scores": {"alice": 0.95}}]).round(4).tolist()
        [0.05]

        ```
        """
        return self._read_all(list(outputs), self.rows)[2]

    def _read_all(self, outputs: list[Mapping[str, Any]], first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(deferred, the chosen expert's index or -1, the estimated error) of each output, recalibrated."""
        deferred = np.zeros(len(outputs), dtype=bool)
        chosen = np.full(len(outputs), -1)
        source = np.empty(len(outputs), dtype=object)
        chance = np.zeros(len(outputs))
        for i, out in enumerate(outputs):
            deferred[i], chosen[i], error = self._read(out, first + i)
            chance[i] = 1.0 - error
            source[i] = ("route" if "estimated_accuracy" in out and "class_score" not in out else
                         f"expert:{self.expert_names[chosen[i]]}" if deferred[i] else "classifier")
        for key, (x, y) in self._maps.items():
            rows = source == key
            if rows.any():
                chance[rows] = np.interp(chance[rows], x, y)
        return deferred, chosen, 1.0 - chance

    def _read(self, out: Mapping[str, Any], row: int) -> tuple[bool, int, float]:
        """(deferred, the chosen expert's index or -1, the estimated error) of one output."""
        try:
            defer = out["defer"]
            if isinstance(defer, str):
                defer = {"true": True, "false": False, "1": True, "0": False}[defer.strip().lower()]
            defer = bool(defer)
            expert = out.get("expert")
            expert = None if expert is None or (isinstance(expert, float) and math.isnan(expert)) or expert == "" \
                else str(expert)
            if "estimated_accuracy" in out and "class_score" not in out:  # a route-only model
                error = 1.0 - float(out["estimated_accuracy"])
            elif defer:
                error = 1.0 - float(_expert_scores(out, self.expert_names)[expert])
            else:
                error = 1.0 - float(out["class_score"])
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"output {row} is not a deferral pipeline's output (defer, expert, class_score and "
                             f"expert_scores, or a route-only model's estimated_accuracy): {problem!r} in "
                             f"{dict(out)!r:.200}.") from None
        if defer and expert not in self.expert_names:
            raise ValueError(f"output {row} is deferred to {expert!r}, which is not among the experts "
                             f"{self.expert_names}.")
        if not 0 <= error <= 1:
            raise ValueError(f"output {row} has an estimated probability outside [0, 1] (error {error!r}).")
        return defer, self.expert_names.index(expert) if expert in self.expert_names else -1, error

    def _label(self, labels: Any, answers: Any, ids: list[str]) -> None:
        if self.audit_rate is None:
            raise ValueError("labels were given but the monitor expects none: build it with audit_rate= (the share "
                             "of kept inputs drawn for an audit; 0 to label deferred inputs only).")
        labels = _by_id(labels, ids, "labels")
        answers = _by_id(answers, ids, "expert_answers")
        for key, label in labels.items():
            pending = self._pending.get(key)
            if pending is None:  # not drawn for a label, labelled already, or unknown: counted, not used
                self.labels_ignored += 1
                continue
            out = pending["output"]
            if "estimated_accuracy" in out and "class_score" not in out:  # route-only: correctness of the choice
                try:
                    loss = 1.0 - float(label)
                except (TypeError, ValueError):
                    raise ValueError(f"label of row {key!r} must be 1 (the chosen expert was right) or 0 for a "
                                     f"route-only model, got {label!r}.") from None
                if loss not in (0.0, 1.0):
                    raise ValueError(f"label of row {key!r} must be 1 or 0 for a route-only model, got {label!r}.")
            elif pending["deferred"]:
                answer = answers.get(key)
                if answer is None and out.get("answered_by") not in (None, "classifier") and out.get("label") not in (
                        None, "defer"):
                    answer = out["label"]  # a model expert answered
                if answer is None:
                    raise ValueError(f"row {key!r} was deferred to {out.get('expert')!r} and is labelled, but the "
                                     "expert's answer is missing: give expert_answers= (when the reviewer's answer "
                                     "is final, give it as both label and answer).")
                loss = float(self._name(answer) != self._name(label))
            else:
                loss = float(self._name(out["class_label"]) != self._name(label))
            pending["entry"][1] = pending["weight"] * loss
            del self._pending[key]

    def _name(self, value: Any) -> str:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and str(value) in self.id2label:
            return self.id2label[str(value)]
        return str(value)

    def _drain(self) -> None:
        """Feeds the labelled channel the rows, in order, up to the first still awaiting its label."""
        if "system_error" not in self.channels:
            return
        values = []
        while self._queue and self._queue[0][1] is not None:
            values.append(self._queue.popleft()[1])
        self.channels["system_error"].update(np.asarray(values, dtype=np.float64))

    # -- reading it ----------------------------------------------------------------------------------------------

    @property
    def alarms(self) -> list[dict[str, Any]]:
        """Every channel's alarm, the first raised first."""
        found = [c.alarm() for c in self.channels.values()]
        return sorted((a for a in found if a is not None), key=lambda a: a["raised_at_row"])

    @property
    def alarm(self) -> dict[str, Any] | None:
        """The first alarm raised (what broke, since which row, at which row and with what evidence), or `None`.
        An alarm stays raised: the monitor of a model recalibrated on recent data starts afresh."""
        alarms = self.alarms
        return alarms[0] if alarms else None

    def state(self) -> dict[str, Any]:
        """Everything at this time, JSON-ready: the rows seen, the confidence and its split, each channel's mean,
        interval, target and evidence, the rows awaiting labels, the labels given for rows not drawn for one (or
        unknown, or labelled before: they do not enter the weighted estimate), and the alarms."""
        return {
            "rows": self.rows, "confidence": self.confidence, "tests": self.tests, "alpha_per_test": self.alpha,
            "audit_rate": self.audit_rate, "awaiting_labels": len(self._pending),
            "labels_ignored": self.labels_ignored,
            "channels": {name: channel.state() for name, channel in self.channels.items()},
            "alarm": self.alarm, "alarms": self.alarms, "not_monitored": list(self.not_monitored),
            "recalibration": self.recalibration, "horizon": self.horizon,
            "guarantee": None if self.guarantee is None else {
                key: self.guarantee.get(key) for key in ("threshold", "confidence", "n", "date")},
        }


def _calibration_test(estimates: Any, outcomes: Any) -> dict[str, float]:
    r"""Cox's calibration test (Cox, Biometrika 1958) of estimated chances against what happened: the likelihood
    ratio of the logistic recalibration ``logit P(outcome = 1) = a + b logit(estimate)``, fitted by maximum
    likelihood, against the estimates as they are (``a = 0, b = 1``), chi-squared with 2 degrees of freedom under
    calibration (1 when every estimate is the same: the intercept alone). Estimates are clipped to
    [1e-9, 1 - 1e-9].

    Args:
        estimates (array of `float`): the estimated chances, in [0, 1].
        outcomes (array of 0/1): what happened.

    Returns:
        `dict`: ``rows``, ``statistic`` (twice the log-likelihood gained), ``df``, ``p_value``, and the fitted
        ``intercept`` (a) and ``slope`` (b; 1 when every estimate is the same).

    Example:

    ```python
    >>> from hf_defer.monitoring.monitor import _calibration_test
    >>> test = _calibration_test([0.7] * 10, [1] * 6 + [0] * 4)  # 6 right where 7 were expected
    >>> round(test["statistic"], 4)  # 2 (6 log(0.6 / 0.7) + 4 log(0.4 / 0.3))
    0.4516
    >>> test["df"], round(test["p_value"], 2)
    (1, 0.5)

    ```
    """
    from scipy.stats import chi2

    x = np.clip(np.asarray(estimates, dtype=np.float64).reshape(-1), 1e-9, 1 - 1e-9)
    y = np.asarray(outcomes, dtype=np.float64).reshape(-1)
    if x.shape != y.shape or x.size == 0 or not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"the calibration test needs as many 0/1 outcomes as estimates, got {y.size} outcomes for "
                         f"{x.size} estimates.")
    z = np.log(x) - np.log1p(-x)

    def loglik(eta: np.ndarray) -> float:
        return float(np.sum(y * eta - np.logaddexp(0.0, eta)))

    if np.ptp(z) == 0:  # one estimate: only the intercept can move (the maximum puts P at the share of ones)
        share = float(np.clip(y.mean(), 1e-12, 1 - 1e-12))
        a, b, df = math.log(share / (1 - share)) - float(z[0]), 1.0, 1
        best = loglik(z + a)
    else:  # the maximum-likelihood logistic fit, unpenalised (Newton's method with a Cholesky solve)
        from sklearn.linear_model import LogisticRegression

        fit = LogisticRegression(C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=100).fit(z[:, None], y)
        (a, b), df = (float(fit.intercept_[0]), float(fit.coef_[0, 0])), 2
        best = max(loglik(a + b * z), loglik(z))  # the fit's optimum, at least the estimates' own
    statistic = max(0.0, 2.0 * (best - loglik(z)))
    return {"rows": int(x.size), "statistic": statistic, "df": df, "p_value": float(chi2.sf(statistic, df)),
            "intercept": float(a), "slope": float(b)}


def monitor_for(model: Any, **kwargs: Any) -> DeferralMonitor:
    """The monitor a served model gets: [`DeferralMonitor.from_model`] when the model carries a guarantee, else one
    without targets (the rates and the label-free error estimate with their bounds, and no alarm).

    Example:

    ```python
    >>> import hf_defer
    >>> from hf_defer.monitoring import monitor_for
    >>> monitor = monitor_for(hf_defer.DeferralConfig(feature_size=4, num_labels=2))  # not calibrated: no targets
    >>> monitor.state()["channels"]["deferral_rate"]["target"] is None
    True

    ```
    """
    config = _config_of(model)
    if DeferralGuarantee.from_config(config) is not None:
        return DeferralMonitor.from_model(config, **kwargs)
    return DeferralMonitor(list(config.expert_names), id2label=getattr(config, "id2label", None), **kwargs)


def _expert_scores(out: Mapping[str, Any], names: list[str]) -> dict[str, float]:
    scores = out.get("expert_scores")
    if scores is None and "expert_accuracy" in out:
        scores = dict(zip(names, out["expert_accuracy"]))
    if scores is None:
        scores = {name: out[f"expert_accuracy_{name}"] for name in names}  # a decision log's columns
    return scores


def _by_id(values: Any, ids: list[str], name: str) -> dict[str, Any]:
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return {str(k): v for k, v in values.items() if v is not None and not (isinstance(v, float) and
                                                                                 math.isnan(v))}
    values = list(values)
    if len(values) != len(ids):
        raise ValueError(f"{name} has {len(values)} entries for the {len(ids)} outputs of this call (give a dict "
                         "{id: value} for rows of earlier calls).")
    return {k: v for k, v in zip(ids, values) if v is not None and not (isinstance(v, float) and math.isnan(v))}
