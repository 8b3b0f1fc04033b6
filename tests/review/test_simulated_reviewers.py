"""Simulated reviewers: each answer is one of the item's real votes, reviewers on one item take distinct votes, and
reviewer r's answer is distributed as the item's votes (counts / total), checked by simulation against that formula."""

from __future__ import annotations

import doctest
import importlib
from collections import Counter

import numpy as np
import pytest

from hf_defer.review.simulated import reviewer_votes


def test_reviewers_on_one_item_take_distinct_votes_of_that_item():
    counts = np.array([[0, 3, 0], [1, 1, 1], [2, 0, 5], [0, 0, 9]])
    answers = reviewer_votes(counts, 3, seed=1)
    for votes, given in zip(counts, answers):
        assert not Counter(given.tolist()) - Counter(np.repeat(np.arange(3), votes).tolist())  # a sub-multiset
    assert sorted(answers[1].tolist()) == [0, 1, 2] and answers[0].tolist() == [1, 1, 1]


def test_each_reviewer_answers_like_one_random_annotator():
    counts = np.array([[2, 5, 1]] * 20000)
    answers = reviewer_votes(counts, 2, seed=0)
    for reviewer in range(2):
        frequency = np.bincount(answers[:, reviewer], minlength=3) / len(counts)
        assert frequency == pytest.approx([2 / 8, 5 / 8, 1 / 8], abs=0.015)  # 4+ standard errors
    # two reviewers of one item: P(both chose class 1) = 5/8 * 4/7 without replacement, not (5/8)^2
    both = np.mean((answers[:, 0] == 1) & (answers[:, 1] == 1))
    assert both == pytest.approx(5 / 8 * 4 / 7, abs=0.015)


def test_too_few_votes_or_bad_counts_are_refused():
    with pytest.raises(ValueError, match=r"rows \[1\] have \[2\]"):
        reviewer_votes([[1, 1, 1], [1, 1, 0]], 3)
    with pytest.raises(ValueError, match="non-negative integers"):
        reviewer_votes([[0.5, 2.5]], 1)
    with pytest.raises(ValueError, match="positive int"):
        reviewer_votes([[1, 2]], 0)


@pytest.mark.parametrize("name", ["labeling", "tasks", "answers", "pulling", "simulated"])
def test_the_docstring_examples_run(name):
    module = importlib.import_module(f"hf_defer.review.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
