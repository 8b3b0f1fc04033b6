"""Tests of hf_defer.evaluation.plotting: every figure is a PNG, the pooled panels draw the pooled bins."""

from __future__ import annotations

import doctest

import numpy as np

import hf_defer.evaluation.plotting as plotting
from hf_defer.evaluation import reliability_bins

PNG = b"\x89PNG\r\n\x1a\n"


def test_figures_are_written(tmp_path):
    rng = np.random.default_rng(0)
    estimates = {"S-SM": rng.uniform(0, 1.2, 200), "A-SM": rng.uniform(0, 1, 200)}
    plotting.plot_estimate_histograms(estimates, rng.uniform(0, 1, 200), tmp_path / "hist.png", "title")
    runs = {name: [reliability_bins(np.clip(values[:100 * k + 100][100 * k:], 0, 1), rng.random(100) < 0.8)
                   for k in range(2)] for name, values in estimates.items()}
    drawn = plotting.plot_pooled_reliability(runs, tmp_path / "rel.png")
    plotting.plot_reliability_diagram([runs["A-SM"][0], runs["S-SM"][1]], tmp_path / "card.png", ["a", "b"])
    for name in ("hist.png", "rel.png", "card.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    assert sum(drawn["S-SM"]["counts"]) == 200 and list(drawn) == ["S-SM", "A-SM"]


def test_plotting_leaves_no_pyplot_figure_open(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plotting.plot_reliability_diagram(reliability_bins([0.2, 0.9], [0, 1], n_bins=3), tmp_path / "a.png")
    assert plt.get_fignums() == before


def test_docstring_examples_run():
    result = doctest.testmod(plotting, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_each_bar_says_how_many_inputs_its_bin_holds(tmp_path, monkeypatch):
    """Counted by hand: estimates 0.05, 0.1 (bin 0 of 4), 0.6 (bin 2), 0.9, 0.95, 0.99 (bin 3); bin 1 is empty."""
    from matplotlib.figure import Figure

    estimates, correct = [0.05, 0.1, 0.6, 0.9, 0.95, 0.99], [0, 1, 1, 1, 1, 0]
    figure = plotting.plot_reliability_diagram(reliability_bins(estimates, correct, n_bins=4), tmp_path / "one.png")
    labels = [text.get_text() for text in figure.axes[0].texts]
    assert labels == ["2", "", "1", "3"]  # one per bar, in bin order; nothing above the empty bin
    assert all(text.xy[1] <= 1.0 for text in figure.axes[0].texts)  # anchored on bars of height <= 1
    assert figure.axes[0].get_ylim()[1] > 1.0  # and there is room above a full bar

    drawn_figures = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn_figures.append(self), original(self, *a, **k)))
    runs = [reliability_bins(estimates[:3], correct[:3], n_bins=4), reliability_bins(estimates[3:], correct[3:], n_bins=4)]
    plotting.plot_pooled_reliability({"A-SM": runs}, tmp_path / "pooled.png")
    assert [text.get_text() for text in drawn_figures[-1].axes[0].texts] == ["2", "", "1", "3"]  # the runs pooled
