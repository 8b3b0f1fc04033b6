"""Monitoring: a deferral model's promises watched in deployment.

- `sequential`: anytime-valid statistics for streams of values in [0, 1]: [`BettingConfidenceSequence`] and the
  sequential test [`ChangeDetector`] (testing by betting).
- `monitor`: [`DeferralMonitor`], fed the pipeline's outputs (and labels that arrive later), with a bound per promise
  and an alarm whose false-alarm probability over the whole stream is at most ``1 - confidence``.
- `prometheus`: [`register_monitor_metrics`], the monitor's gauges on a prometheus-client registry (for `/metrics`).

It imports `hf_defer.modeling` and numpy (prometheus-client only inside `register_monitor_metrics`), never evaluation's
callers or anything above: `serving` and `commands` import it.
"""

from .monitor import DeferralMonitor, monitor_for
from .prometheus import register_monitor_metrics
from .sequential import BettingConfidenceSequence, ChangeDetector

__all__ = ["BettingConfidenceSequence", "ChangeDetector", "DeferralMonitor", "monitor_for", "register_monitor_metrics"]
