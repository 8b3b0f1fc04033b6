"""The deferral guarantee as one type: what [`certify_threshold`] certified and, once recorded on a model, what it holds
for, with its serialisation (``config.deferral_guarantee``) and the rule "does this call still fall under it".

Standard library only: the config, the pipeline, the card, the CLI, the monitor and ``serve`` all read a model's
guarantee through [`DeferralGuarantee.from_config`] and judge a call through [`DeferralGuarantee.differences`].
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

SAME_THRESHOLD = 1e-12
"""Two thresholds closer than this are the same one (a threshold read back from ``config.json`` is the one saved)."""

PER_INPUT = "given per input"
"""``available_experts`` of a guarantee calibrated with one availability row per input (the pipeline cannot check
a call against it)."""

DEFAULT_ASSUMPTION = ("new inputs are drawn independently from the same distribution as the calibration inputs "
                      "(same experts, costs and availability)")

_CERTIFICATE = ("threshold", "confidence", "n", "claims", "assumption")
_RECORD = ("date", "expert_names", "expert_costs", "available_experts")


@dataclass(frozen=True)
class DeferralGuarantee:
    """What [`certify_threshold`] certified: the threshold and, for each promise, its kind, target and bound; once
    recorded on a model (``config.deferral_guarantee``, by [`calibrate_deferral`]), also the date and the experts,
    costs and availability it holds for.

    Each claim holds with probability at least its own ``confidence`` over the draw of the calibration inputs; the
    shares add up (Bonferroni) so that all hold together with probability at least ``confidence``. ``observed`` is
    the value on the calibration inputs at the threshold. An *expected-error* guarantee (``guarantee="expected"``,
    [`DeferralGuarantee.expected`]) has no confidence (`None`): its one claim (``"guarantee": "expected"``) bounds
    the error averaged over calibration draws and new inputs, a refused calibration counting as no error, and says
    nothing about this one calibration.

    Args:
        threshold (`float`): the certified deferral threshold.
        confidence (`float` or `None`): of all the claims together; `None` for an expected-error guarantee.
        n (`int`): the number of calibration inputs.
        claims (`list[dict]`): one per promise: ``kind``, ``target``, ``bound``, ``confidence``, ``observed`` (and
            ``expert``, ``method``, ``cost_bound`` where they apply).
        assumption (`str`): what the promise assumes of new inputs.
        date (`str`, *optional*): the calibration's date (ISO), once recorded on a model.
        expert_names (`list[str]`, *optional*): the experts it holds for, once recorded on a model.
        expert_costs (`list[float]`, *optional*): the costs it holds for; `None`: all 0.
        available_experts (`list[str]` or `str`, *optional*): the experts available in the calibration call; `None`:
            all of them, ``"given per input"``: one row per input (not checked on a call).

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
    >>> recorded = guarantee.recorded(["alice", "bob"], date="2026-11-28")  # what config.deferral_guarantee stores
    >>> DeferralGuarantee.from_dict(recorded.to_dict()) == recorded
    True
    >>> recorded.differences(guarantee.threshold + 0.1, expert_costs=[0.0, 0.0])  # doctest: +ELLIPSIS
    ['defer_threshold ... (certified: ...)']

    ```
    """

    threshold: float
    confidence: float | None
    n: int
    claims: list[dict[str, Any]] = field(default_factory=list)
    assumption: str = DEFAULT_ASSUMPTION
    date: str | None = None
    expert_names: list[str] | None = None
    expert_costs: list[float] | None = None
    available_experts: list[str] | str | None = None

    # --- serialisation (config.json keeps the dict it always had) ---
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeferralGuarantee":
        """The guarantee of a ``config.deferral_guarantee`` dict (or of [`DeferralGuarantee.to_dict`]); a `ValueError` names a missing
        key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"deferral_guarantee must be a dict, got {type(data).__name__}.")
        missing = [key for key in ("threshold", "confidence", "n") if key not in data]
        if missing:
            raise ValueError(f"deferral_guarantee lacks {missing}: expected the dict calibrate_deferral records "
                             f"(keys {list(_CERTIFICATE + _RECORD)}), got keys {sorted(data)}.")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (as ``config.json`` stores it): the certificate's keys, and the record's once it is bound to a
        model's experts."""
        out = {key: getattr(self, key) for key in _CERTIFICATE}
        out["claims"] = [dict(claim) for claim in self.claims]
        if self.expert_names is not None or self.date is not None:
            out.update({key: getattr(self, key) for key in _RECORD})
        return out

    @classmethod
    def from_config(cls, config: Any) -> "DeferralGuarantee | None":
        """A model config's guarantee (``config.deferral_guarantee``), `None` where there is none."""
        value = getattr(config, "deferral_guarantee", None)
        if isinstance(value, cls):
            return value
        return cls.from_dict(value) if isinstance(value, Mapping) and value else None

    def recorded(self, expert_names: Sequence[str], *, expert_costs: Sequence[float] | None = None,
                 available_experts: list[str] | str | None = None, date: str | None = None) -> "DeferralGuarantee":
        """This certificate bound to a model's experts, costs and availability (what a config records)."""
        return dataclasses.replace(self, date=date, expert_names=list(expert_names),
                                   expert_costs=None if expert_costs is None else [float(c) for c in expert_costs],
                                   available_experts=available_experts)

    # --- the rule: does a call still fall under it ---
    def differences(self, threshold: float | None = None, *, expert_costs: Sequence[float] | None = None,
                    expert_names: Sequence[str] | None = None,
                    available: Sequence[bool] | None = None) -> list[str]:
        """What a call changes of what was certified, one phrase each (empty: the call is covered).

        Args:
            threshold (`float`, *optional*): the call's deferral threshold (not checked when `None`).
            expert_costs (`list[float]`, *optional*): the call's costs (`None`: not checked; all 0 is ``[0.0] * M``).
            expert_names (`list[str]`, *optional*): the model's experts (`None`: not checked).
            available (`list[bool]`, *optional*): the call's whole-call availability, one flag per expert in
                ``expert_names`` order (`None`: every expert, not checked).
        """
        names = list(expert_names) if expert_names is not None else list(self.expert_names or [])
        reasons = []
        if threshold is not None and not self.same_threshold(threshold):
            reasons.append(f"defer_threshold {float(threshold)!r} (certified: {self.threshold!r})")
        if expert_costs is not None:
            certified = self.expert_costs or [0.0] * len(expert_costs)
            if [float(c) for c in expert_costs] != [float(c) for c in certified]:
                reasons.append(f"expert_costs {list(expert_costs)} (certified: {certified})")
        if expert_names is not None and self.expert_names is not None and names != list(self.expert_names):
            reasons.append(f"experts {names} (certified: {self.expert_names})")
        if available is not None and self.available_experts != PER_INPUT:
            asked = [name for name, on in zip(names, available) if bool(on)]
            if sorted(asked) != sorted(self.available_experts or names):
                reasons.append(f"available_experts {asked} (certified: {self.available_experts or names})")
        return reasons

    def covers(self, threshold: float | None = None, **call: Any) -> bool:
        """Whether a call (as in [`DeferralGuarantee.differences`]) falls under this guarantee."""
        return not self.differences(threshold, **call)

    def same_threshold(self, threshold: float) -> bool:
        """Whether ``threshold`` is the certified one (within ``SAME_THRESHOLD``)."""
        return abs(float(threshold) - float(self.threshold)) <= SAME_THRESHOLD

    @property
    def expected(self) -> bool:
        """Whether this is an expected-error guarantee (``guarantee="expected"``: no confidence, the error bounded on
        average over calibration draws) rather than a promise that holds with probability ``confidence``."""
        return self.confidence is None

    def claims_text(self) -> str:
        """The claims in short (``"deferral_rate <= 0.1, system_error <= 0.05"``), as warnings name them."""
        return ", ".join(f"{claim.get('kind')} <= {claim.get('target')}" for claim in self.claims)

    def strength_text(self) -> str:
        """How the claims hold, in short: ``"with confidence 0.9"``, or ``"in expectation over calibration draws"``."""
        return "in expectation over calibration draws" if self.expected else f"with confidence {self.confidence}"


__all__ = ["DeferralGuarantee", "PER_INPUT", "SAME_THRESHOLD"]
