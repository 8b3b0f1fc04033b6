"""The monitor's gauges on a prometheus-client registry, read from the monitors at each scrape (`/metrics`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .monitor import DeferralMonitor

__all__ = ["register_monitor_metrics"]

_GAUGES = (
    ("mean", "hf_defer_monitor_mean", "The monitored quantity on the rows seen (label-free channels: all rows)."),
    ("lower", "hf_defer_monitor_lower", "Lower end of its anytime-valid confidence interval."),
    ("upper", "hf_defer_monitor_upper", "Upper end of its anytime-valid confidence interval."),
    ("target", "hf_defer_monitor_target", "The certified target (budget or error target) it is tested against."),
    ("evidence", "hf_defer_monitor_evidence", "E-value against 'the target holds'; the alarm fires at threshold."),
    ("threshold", "hf_defer_monitor_threshold", "1/alpha: the e-value at which the channel's alarm fires."),
)


def register_monitor_metrics(registry: Any, monitors: Mapping[str, DeferralMonitor] | Callable[
        [], Mapping[str, DeferralMonitor]]) -> Any:
    """Registers on ``registry`` a collector that exposes each monitor's state as gauges, labelled by ``model`` (the
    name the monitor is served under) and ``channel`` (``deferral_rate``, ``deferral_rate[<expert>]``,
    ``estimated_error``, ``system_error``, ``mean_cost``):

    - `hf_defer_monitor_mean`, `_lower`, `_upper`: the quantity and its anytime-valid interval;
    - `hf_defer_monitor_target`, `_evidence`, `_threshold`: the target, the e-value against it and 1/alpha;
    - `hf_defer_monitor_alarm{model,channel}`: 1 once the channel's alarm is raised (it stays raised);
    - `hf_defer_monitor_alarm_since_row{model,channel}`: where the change began, by the evidence;
    - `hf_defer_monitor_rows{model}`, `hf_defer_monitor_awaiting_labels{model}`, `hf_defer_monitor_confidence{model}`.

    A quantity without a value (no target, no rows yet) is left out rather than shown as 0.

    Args:
        registry (`prometheus_client.CollectorRegistry`): where to register.
        monitors (`dict` or callable): name to [`DeferralMonitor`], or a function returning that (read per scrape).

    Returns:
        The collector (``registry.unregister(collector)`` removes it).

    Example:

    ```python
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> from hf_defer import DeferralMonitor
    >>> from hf_defer.monitoring import register_monitor_metrics
    >>> registry = CollectorRegistry()
    >>> monitor = DeferralMonitor(["alice"], max_deferral_rate=0.1)
    >>> _ = register_monitor_metrics(registry, {"demo": monitor})
    >>> b'hf_defer_monitor_alarm{channel="deferral_rate",model="demo"} 0.0' in generate_latest(registry)
    True

    ```
    """
    from prometheus_client.core import GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterator[Any]:
            current = monitors() if callable(monitors) else monitors
            families = {key: GaugeMetricFamily(name, doc, labels=["model", "channel"]) for key, name, doc in _GAUGES}
            alarm = GaugeMetricFamily("hf_defer_monitor_alarm", "1 once the channel's alarm is raised.",
                                      labels=["model", "channel"])
            since = GaugeMetricFamily("hf_defer_monitor_alarm_since_row", "Row where the alarmed change began.",
                                      labels=["model", "channel"])
            rows = GaugeMetricFamily("hf_defer_monitor_rows", "Decisions seen by the monitor.", labels=["model"])
            waiting = GaugeMetricFamily("hf_defer_monitor_awaiting_labels", "Rows drawn for a label, not labelled yet.",
                                        labels=["model"])
            confidence = GaugeMetricFamily("hf_defer_monitor_confidence",
                                           "1 - the false-alarm probability of all alarms together.", labels=["model"])
            for model, monitor in current.items():
                state = monitor.state()
                rows.add_metric([model], state["rows"])
                waiting.add_metric([model], state["awaiting_labels"])
                confidence.add_metric([model], state["confidence"])
                for channel, values in state["channels"].items():
                    for key in families:
                        if values.get(key) is not None:
                            families[key].add_metric([model, channel], float(values[key]))
                    if values["target"] is not None:
                        alarm.add_metric([model, channel], 1.0 if values["alarm"] else 0.0)
                    if values["alarm"]:
                        since.add_metric([model, channel], float(values["alarm"]["since_row"]))
            yield from (*families.values(), alarm, since, rows, waiting, confidence)

    collector = _Collector()
    registry.register(collector)
    return collector
