"""The cascade's names: `hf_defer.cascade.__all__` lists what its modules define, and the names the package re-exports
(`hf_defer.DeferralCascade`, the "deferral-cascade" task) are the subpackage's own objects."""

from __future__ import annotations

from transformers.pipelines import PIPELINE_REGISTRY

import hf_defer
import hf_defer.cascade as cascade
from hf_defer.cascade import modeling_cascade, pipeline_cascade


def test_the_subpackage_exports_every_public_name_of_its_modules():
    defined = set(modeling_cascade.__all__) | set(pipeline_cascade.__all__)
    assert set(cascade.__all__) == defined
    for name in cascade.__all__:
        assert getattr(cascade, name) is getattr(modeling_cascade if name in modeling_cascade.__all__
                                                 else pipeline_cascade, name)


def test_the_package_names_are_the_subpackage_objects():
    assert "DeferralCascade" in hf_defer.__all__ and hf_defer.DeferralCascade is cascade.DeferralCascade
    task = PIPELINE_REGISTRY.supported_tasks[cascade.CASCADE_TASK]
    assert task["impl"] is cascade.DeferralCascadePipeline
