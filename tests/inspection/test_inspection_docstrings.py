"""The runnable examples in hf_defer.inspection's docstrings."""

from __future__ import annotations

import doctest


def test_docstring_examples_run():
    import hf_defer.inspection.adapters as adapters

    result = doctest.testmod(adapters, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
