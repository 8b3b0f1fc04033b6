"""The warnings a deferral call gives when it decides otherwise than the model was calibrated or certified for: the
guarantee's (``config.deferral_guarantee``, whose rule is [`DeferralGuarantee.differences`]) and the calibrated
costs and threshold's (``config.calibrated_expert_costs``).

Like ``pipeline_deferral.py``, this module imports only ``numpy``, the standard library and its siblings: it is copied
next to the weights for remote-code loading (``trust_remote_code=True``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .guarantee_record import SAME_THRESHOLD, DeferralGuarantee

__all__ = ["warn_outside_calibration", "warn_outside_guarantee"]


def warn_outside_guarantee(config: Any, expert_costs: Any, defer_threshold: Any, available: Any) -> None:
    """Warns when a call decides otherwise than ``config.deferral_guarantee`` was certified for (`calibrate_deferral`
    with a confidence): other costs, experts, threshold or whole-call availability
    ([`DeferralGuarantee.differences`]). The promise then does not hold."""
    guarantee = DeferralGuarantee.from_config(config)
    if guarantee is None:
        return
    names = list(config.expert_names)
    costs = getattr(config, "expert_costs", None) if expert_costs is None else expert_costs
    reasons = guarantee.differences(
        float(config.defer_threshold if defer_threshold is None else defer_threshold),
        expert_costs=list(costs or [0.0] * len(names)), expert_names=names,
        available=None if available is None else np.asarray(available, dtype=bool))
    if reasons:
        warnings.warn(f"this call is not covered by the model's deferral guarantee ({guarantee.claims_text()} "
                      f"{guarantee.strength_text()}): it decides with {'; '.join(reasons)}. Calibrate again "
                      "(hf_defer.calibrate_deferral) for these settings.", UserWarning, stacklevel=4)


def warn_outside_calibration(config: Any, expert_costs: Any, defer_threshold: Any) -> None:
    """Warns when a call decides with other costs or another threshold than ``config.defer_threshold`` was calibrated
    for (``config.calibrated_expert_costs``, set by `calibrate_deferral`): the threshold then no longer meets its
    budget, and the decisions shift (a cost of 0.1 can route every input elsewhere). A model with a
    ``deferral_guarantee`` warns through [`warn_outside_guarantee`] instead."""
    calibrated = getattr(config, "calibrated_expert_costs", None)
    if calibrated is None or DeferralGuarantee.from_config(config) is not None:
        return
    costs = getattr(config, "expert_costs", None) if expert_costs is None else expert_costs
    costs = [float(c) for c in (costs or [0.0] * len(calibrated))]
    reasons = []
    if costs != [float(c) for c in calibrated]:
        reasons.append(f"expert_costs {costs} (calibrated at {[float(c) for c in calibrated]})")
    if defer_threshold is not None and abs(float(defer_threshold) - float(config.defer_threshold)) > SAME_THRESHOLD:
        reasons.append(f"defer_threshold {float(defer_threshold)!r} (calibrated: {float(config.defer_threshold)!r})")
    if reasons:
        warnings.warn(f"this call decides with {'; '.join(reasons)}: the model's defer_threshold was calibrated "
                      "for other settings, so its deferral budget no longer holds and the decisions shift. Calibrate "
                      "again for these settings (hf_defer.calibrate_deferral, or `hf-defer calibrate --expert_costs`).",
                      UserWarning, stacklevel=4)
