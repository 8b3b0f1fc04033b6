"""Tests of research.finetune_overhead: paired ratios by hand and the report's tables."""

from __future__ import annotations

import doctest

import pytest

import research.finetune_overhead as overhead


def _run(steps_per_s: float, cpu: float, rss: float) -> dict[str, float]:
    return {"train_steps_per_s": steps_per_s, "train_cpu_s_per_step": cpu, "eval_examples_per_s": 50.0,
            "eval_cpu_ms_per_example": 10.0, "setup_rss_mib": rss, "peak_rss_mib": 2 * rss}


def test_paired_ratio_inverts_rates_and_pairs_repeats():
    results = {"anchor": [_run(2.0, 1.0, 100), _run(1.0, 1.0, 100)], "defer-M1": [_run(1.0, 1.2, 110), _run(1.0, 1.0, 100)]}
    # Rates: anchor / deferral = 2 and 1. Costs: deferral / anchor = 1.2 and 1.0.
    assert overhead.paired_ratio(results, "defer-M1", "train_steps_per_s") == [1.0, 2.0]
    assert overhead.paired_ratio(results, "defer-M1", "train_cpu_s_per_step") == pytest.approx([1.0, 1.2])


def test_report_states_the_targets():
    results = {"anchor": [_run(2.0, 1.0, 100), _run(2.0, 1.0, 100)], "defer-M1": [_run(2.0, 1.05, 100), _run(2.0, 1.3, 120)]}
    text = overhead.overhead_report(results, overhead.OverheadSettings(repeats=2), {"train": 256, "eval": 256},
                                    [(1.0, 0, 0), (2.5, 0, 0)], "bench")
    # CPU ratios 1.05 and 1.3: median 1.175 > 1.10, missed; peak RSS ratios 1.0 and 1.2: median 1.1, met.
    assert "| defer-M1 | 1.175 (1.05-1.30) **MISSED** |" in text and "| 1.100 (1.00-1.20) met |" in text
    assert "| anchor | 2.000 | 2.000, 2.000 | 1.000 |" in text and "(max 2.50 on" in text
    assert "256 train / 256 eval examples" in text and "`bench`" in text


def test_docstring_examples_run():
    result = doctest.testmod(overhead, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
