"""Simulated reviewers for the review loop's demo and tests, drawn from the CrowdFlower votes shipped with HateSpeech,
and their answers submitted through Label Studio's API.

The shipped data holds, for each tweet, how many of its 3 to 9 CrowdFlower annotators chose each class, not who they
were. A simulated reviewer is therefore a seat, not a person: on each tweet, the tweet's votes are put in a seeded
random order and reviewer `r` answers with the `r`-th of them. On one tweet, R reviewers give R distinct real votes
(R is at most 3, the smallest number of annotators of a tweet); across tweets, reviewer `r` is a different
CrowdFlower worker each time, so the simulated reviewers are equally skilled in expectation and their errors are those
of real annotators on that tweet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..modeling.validators import check_positive_int
from .client import ReviewProject
from .labeling import CONTROL_NAME, OBJECT_NAME

__all__ = ["ensure_reviewers", "reviewer_votes", "submit_answers"]


def reviewer_votes(counts: np.ndarray | Sequence[Sequence[int]], num_reviewers: int,
                   seed: int | np.random.Generator = 0) -> np.ndarray:
    """What each simulated reviewer answers on each item: `[N, num_reviewers]` class ids, row `i` being distinct votes
    of item `i`'s annotators (drawn without replacement, in a seeded random order).

    Args:
        counts (`array [N, K]`): per item, the number of annotators who chose each class.
        num_reviewers (`int`): reviewers to simulate; at most the smallest row total.
        seed (`int` or `numpy.random.Generator`, *optional*, defaults to 0).

    Raises:
        ValueError: counts that are not non-negative integers, or an item with fewer votes than `num_reviewers`.

    Example:

    ```python
    >>> from hf_defer.review.simulated import reviewer_votes
    >>> votes = reviewer_votes([[0, 3, 0], [1, 1, 1]], num_reviewers=3, seed=0)
    >>> votes[0].tolist(), sorted(votes[1].tolist())  # the first tweet's three votes; the second's, in some order
    ([1, 1, 1], [0, 1, 2])

    ```
    """
    counts = np.asarray(counts)
    if counts.ndim != 2 or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
        raise ValueError(f"`counts` must be an [N, K] array of non-negative integers, got dtype {counts.dtype} and "
                         f"shape {counts.shape}.")
    check_positive_int(num_reviewers, "num_reviewers")
    totals = counts.sum(axis=1)
    short = np.flatnonzero(totals < num_reviewers)
    if len(short):
        raise ValueError(f"`num_reviewers`={num_reviewers} needs that many votes per item; rows {short[:5].tolist()} "
                         f"have {totals[short[:5]].tolist()}.")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    answers = np.empty((len(counts), num_reviewers), dtype=np.int64)
    for row, votes in enumerate(counts):
        answers[row] = rng.permutation(np.repeat(np.arange(len(votes)), votes))[:num_reviewers]
    return answers


def ensure_reviewers(project: ReviewProject, names: Sequence[str], domain: str = "example.com") -> dict[str, int]:
    """Label Studio accounts `<name>@<domain>` for the simulated reviewers (created when missing): name -> user id."""
    existing = {email: user_id for user_id, email in project.users(refresh=True).items()}
    ids = {}
    for name in names:
        email = f"{name}@{domain}"
        if email not in existing:
            existing[email] = project.client.users.create(email=email, username=name).id
        ids[name] = existing[email]
    project.users(refresh=True)
    return ids


def submit_answers(project: ReviewProject, answers: Sequence[tuple[int, int, str]],
                   lead_times: Sequence[float] | None = None) -> int:
    """Submit answers through the annotation API, each filed under its reviewer: `(task_id, user_id, class_name)`.

    Returns:
        `int`: the number of answers submitted.
    """
    for index, (task_id, user_id, answer) in enumerate(answers):
        result = [{"from_name": CONTROL_NAME, "to_name": OBJECT_NAME, "type": "choices",
                   "value": {"choices": [answer]}}]
        extra: Mapping[str, Any] = {} if lead_times is None else {"lead_time": float(lead_times[index])}
        project.client.annotations.create(id=int(task_id), result=result, completed_by=int(user_id), **extra)
    return len(answers)
