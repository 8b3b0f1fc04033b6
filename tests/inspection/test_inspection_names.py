"""`hf_defer.inspection.__all__` lists what its modules define, as the same objects."""

from __future__ import annotations

import hf_defer.inspection as inspection
from hf_defer.inspection import adapters, model_checks


def test_the_subpackage_exports_every_public_name_of_its_modules():
    assert set(inspection.__all__) == set(adapters.__all__) | set(model_checks.__all__)
    for name in inspection.__all__:
        module = adapters if name in adapters.__all__ else model_checks
        assert getattr(inspection, name) is getattr(module, name)
