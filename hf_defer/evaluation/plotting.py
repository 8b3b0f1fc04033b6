"""Figures of deferral models: reliability diagrams of the expert-accuracy estimates and their histograms.

Every function draws on its own `matplotlib.figure.Figure` with the Agg canvas (no pyplot state, no display
needed) and writes a PNG. matplotlib is an optional dependency (`pip install hf-defer[plots]`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .reliability import pool_reliability, reliability_ece

__all__ = ["plot_estimate_histograms", "plot_pooled_reliability", "plot_reliability_diagram"]


def agg_figure(**kwargs: Any) -> Any:
    """A `matplotlib.figure.Figure` (``kwargs``: its arguments) on its own Agg canvas, outside pyplot: the caller's
    backend and figures stay as they were. Every figure of `hf_defer.evaluation` is drawn on one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**kwargs)
    FigureCanvasAgg(figure)
    return figure


def _draw_bins(axes: Any, edges: Sequence[float], accuracy: Sequence[float], counts: Sequence[int],
               **bar_kwargs: Any) -> None:
    """The bars of a reliability diagram, each bin's observed accuracy, with the number of inputs the bin holds written
    above it (none above an empty bin): a tall bar over 3 inputs says less than one over 3,000."""
    edges = np.asarray(edges, dtype=np.float64)
    bars = axes.bar(edges[:-1], np.nan_to_num(np.asarray(accuracy, dtype=np.float64)), width=np.diff(edges),
                    align="edge", edgecolor="black", **bar_kwargs)
    axes.bar_label(bars, labels=[f"{int(count)}" if count else "" for count in counts], padding=2, fontsize=7,
                   rotation=90, color="dimgray")
    axes.set(xlim=(0, 1), ylim=(0, 1.18))  # room above a full bar for its count
    axes.set_yticks(np.linspace(0, 1, 6))


def plot_reliability_diagram(reliability: Any, path: str | os.PathLike,
                             expert_names: list[str] | None = None) -> Any:
    """Draws the reliability diagram(s) of the expert-accuracy estimates of one model into a PNG: per bin of the
    estimate, the share of its inputs the expert got right, and above each bar how many inputs the bin holds.

    Args:
        reliability (`dict` or `list[dict]`): [`reliability_bins`] output, one per expert.
        path (`str` or `os.PathLike`): the PNG file.
        expert_names (`list[str]`, *optional*): panel titles.

    Returns:
        `matplotlib.figure.Figure`: the figure written.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.evaluation import reliability_bins
    >>> from hf_defer.evaluation.plotting import plot_reliability_diagram
    >>> path = os.path.join(tempfile.mkdtemp(), "diagram.png")
    >>> figure = plot_reliability_diagram(reliability_bins([0.2, 0.9, 0.8], [0, 1, 1], n_bins=5), path)
    >>> [text.get_text() for text in figure.axes[0].texts if text.get_text()]  # inputs per non-empty bin
    ['1', '2']
    >>> open(path, "rb").read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
    True

    ```
    """
    diagrams = reliability if isinstance(reliability, list) else [reliability]
    figure = agg_figure(figsize=(4 * len(diagrams), 4), dpi=100)
    for j, diagram in enumerate(diagrams):
        axes = figure.add_subplot(1, len(diagrams), j + 1)
        accuracy = [math.nan if a is None else a for a in diagram["accuracy"]]
        _draw_bins(axes, diagram["bin_edges"], accuracy, diagram["counts"], alpha=0.7, label="observed accuracy")
        axes.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
        axes.set(xlabel="estimated expert accuracy", ylabel="observed expert accuracy")
        title = expert_names[j] if expert_names and j < len(expert_names) else f"expert {j}"
        axes.set_title(f"{title}: {sum(diagram['counts'])} inputs\n(above each bar: how many in its bin)", fontsize=10)
        axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
    return figure


def plot_pooled_reliability(
    diagrams: Mapping[str, Sequence[dict[str, list[float]]]], path: str | os.PathLike, min_count: int = 30
) -> dict[str, dict[str, list[float]]]:
    """Reliability diagrams of several models' expert-accuracy estimates, one panel per model, runs pooled.

    The runs of a model are merged with [`pool_reliability`]; each panel's title gives the ECE of the pooled bins
    ([`reliability_ece`]).

    Args:
        diagrams (`Mapping[str, Sequence[dict]]`): panel title -> the [`reliability_bins`] data of each run.
        path (`str` or `os.PathLike`): the PNG file.
        min_count (`int`, *optional*, defaults to 30): bins with fewer inputs are drawn pale; every bin's number of
            inputs is written above its bar.

    Returns:
        `dict`: the pooled reliability data drawn, per panel title.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.evaluation import reliability_bins
    >>> from hf_defer.evaluation.plotting import plot_pooled_reliability
    >>> runs = [reliability_bins([0.2, 0.9], [0, 1], n_bins=5), reliability_bins([0.8], [1], n_bins=5)]
    >>> plot_pooled_reliability({"A-SM": runs}, os.path.join(tempfile.mkdtemp(), "pooled.png"))["A-SM"]["counts"]
    [0, 1, 0, 0, 2]

    ```
    """
    names = list(diagrams)
    figure = agg_figure(figsize=(3.6 * len(names), 3.4))
    axes = figure.subplots(1, len(names), sharey=True, squeeze=False)
    drawn = {}
    for axis, name in zip(axes[0], names):
        bins = drawn[name] = pool_reliability(diagrams[name])
        counts = np.asarray(bins["counts"])
        colors = ["tab:blue" if count >= min_count else "lightsteelblue" for count in counts]
        _draw_bins(axis, bins["bin_edges"], bins["accuracy"], counts, color=colors, label="observed accuracy")
        axis.plot([0, 1], [0, 1], "--", color="tab:red", label="perfect calibration")
        axis.set_title(f"{name} (ECE {100 * reliability_ece(bins):.2f} %)")
        axis.set_xlabel("estimated expert accuracy")
    axes[0][0].set_ylabel("share of tweets the expert got right")
    axes[0][-1].legend(loc="lower right", fontsize="small")
    figure.suptitle(f"Reliability of the expert-accuracy estimates (above each bar: tweets in the bin, pale if "
                    f"fewer than {min_count})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return drawn


def plot_estimate_histograms(
    estimates: Mapping[str, np.ndarray], true: np.ndarray, path: str | os.PathLike, title: str
) -> None:
    """Histograms of estimated against true expert accuracy, one panel per model (Figure 3 of Cao et al., 2023).

    Args:
        estimates (`Mapping[str, np.ndarray]`): panel title -> estimated accuracy of the expert on the inputs
            (clipped to [0, 1] for drawing).
        true (`np.ndarray`): the true accuracy on the same inputs (e.g. [`~hf_defer.experts.annotator_accuracy`]).
        path (`str` or `os.PathLike`): the PNG file.
        title (`str`): the figure's title.

    Example:

    ```python
    >>> import os, tempfile
    >>> import numpy as np
    >>> from hf_defer.evaluation.plotting import plot_estimate_histograms
    >>> path = os.path.join(tempfile.mkdtemp(), "hist.png")
    >>> plot_estimate_histograms({"A-SM": np.array([0.7, 0.9])}, np.array([1.0, 2 / 3]), path, "expert accuracy")
    >>> os.path.getsize(path) > 0
    True

    ```
    """
    names = list(estimates)
    figure = agg_figure(figsize=(3.6 * len(names), 3.2))
    axes = figure.subplots(1, len(names), sharey=True, squeeze=False)
    bins = np.linspace(0.0, 1.0, 26)
    for axis, name in zip(axes[0], names):
        axis.hist(true, bins=bins, density=True, alpha=0.5, color="tab:gray", label="true")
        axis.hist(np.clip(estimates[name], 0.0, 1.0), bins=bins, density=True, alpha=0.6, color="tab:blue",
                  label="estimated")
        axis.set_title(name)
        axis.set_xlabel("expert accuracy Pr(M = Y | x)")
    axes[0][0].set_ylabel("density")
    axes[0][0].legend(loc="upper left")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
