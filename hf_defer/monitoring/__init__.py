"""Monitoring: a deferral model's promises watched in deployment.

- `sequential`: anytime-valid statistics for streams of values in [0, 1]: [`BettingConfidenceSequence`] and the
  sequential test [`ChangeDetector`] (testing by betting).
- `monitor`: [`DeferralMonitor`], fed the pipeline's outputs (and labels that arrive later), with a bound per promise
  and an alarm whose false-alarm probability over the whole stream is at most ``1 - confidence``; [`monitor_for`], the
  monitor a served model gets.
- `prometheus`: [`register_monitor_metrics`], the monitor's gauges on a prometheus-client registry (for `/metrics`).

It imports `hf_defer.modeling` and numpy (prometheus-client only inside `register_monitor_metrics`), never anything
above: `serving` and `commands` import it. Each name is imported from its module when first read (`hf_defer._lazy`).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "BettingConfidenceSequence": "sequential",
    "ChangeDetector": "sequential",
    "DeferralMonitor": "monitor",
    "monitor_for": "monitor",
    "register_monitor_metrics": "prometheus",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .sequential import BettingConfidenceSequence, ChangeDetector
    from .monitor import DeferralMonitor, monitor_for
    from .prometheus import register_monitor_metrics
