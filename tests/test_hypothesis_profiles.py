"""The default suite is the same on every machine: the hypothesis profile `make test` runs under is derandomized and
reads no example database, and every hypothesis test takes its budget from the profile (`make test-explore` scales
it)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

from hypothesis_profiles import BASE_EXAMPLES, examples, load_profile

TESTS = Path(__file__).resolve().parent


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci", reason="another profile was asked for")
def test_the_default_profile_is_derandomized_without_a_database():
    assert settings.default.derandomize and settings.default.database is None
    assert settings.default.max_examples == BASE_EXAMPLES and examples(200) == 200


def test_the_explore_profile_draws_ten_times_the_examples_at_random():
    explore = settings.get_profile("explore")
    assert not explore.derandomize and explore.max_examples == 10 * BASE_EXAMPLES
    settings.load_profile("explore")  # the budgets test modules compute when explore is loaded
    try:
        assert examples(40) == 400 and examples(200) == 2000
    finally:
        load_profile()


def test_no_test_fixes_its_own_budget_seed_or_database():
    # A literal max_examples would ignore `make test-explore`; a seed, derandomize=False or a database would make the
    # default suite differ between machines.
    found = {}
    for path in TESTS.rglob("*.py"):
        if path.name in {"hypothesis_profiles.py", Path(__file__).name}:
            continue
        text = path.read_text()
        bad = re.findall(r"max_examples=\d|derandomize=|database=|@seed\(|settings\.load_profile", text)
        if bad:
            found[str(path.relative_to(TESTS))] = bad
    assert not found, found
