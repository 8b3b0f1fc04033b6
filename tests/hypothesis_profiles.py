"""The suite's hypothesis profiles (loaded by `tests/conftest.py`; `HYPOTHESIS_PROFILE` picks one).

- ``ci`` (the default, `make test`): derandomized and without the example database, so that every machine and every
  run draws the same examples (a failure on one machine is a failure on all, and a pass is a pass everywhere).
- ``explore`` (`make test-explore`, before a release): random draws, ten times the examples, the local database
  (`.hypothesis/`) replaying what failed. Every failure it finds becomes an ``@example`` in its test, so that the
  ``ci`` profile checks it from then on.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

BASE_EXAMPLES = 100  # the ci profile's max_examples: the budgets the tests name are counted against it

settings.register_profile("ci", max_examples=BASE_EXAMPLES, derandomize=True, database=None, deadline=None,
                          print_blob=True)
settings.register_profile("explore", max_examples=10 * BASE_EXAMPLES, derandomize=False, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])


def load_profile() -> str:
    """Loads the profile that ``HYPOTHESIS_PROFILE`` names (``ci`` unless set) and returns its name."""
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    settings.load_profile(name)  # an unknown name raises hypothesis' InvalidArgument, listing none silently
    return name


def examples(n: int) -> int:
    """A test's own budget ``n`` under the ``ci`` profile, scaled with the loaded profile's ``max_examples``
    (``explore``: ten times ``n``). A test's explicit ``max_examples`` overrides the profile's, hence this."""
    return max(1, n * settings.default.max_examples // BASE_EXAMPLES)
