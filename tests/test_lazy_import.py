"""The lazy package (hf_defer/_lazy.py): `import hf_defer` and the command line load neither torch nor transformers;
every package's table of names agrees with its `if TYPE_CHECKING:` imports and resolves; the registrations with
transformers happen after a bare `import hf_defer`, whichever is imported first; what the pipeline and the model do
does not depend on what else was imported."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hf_defer

PACKAGE = Path(hf_defer.__file__).resolve().parent
ROOT = PACKAGE.parent
HEAVY = {"torch", "transformers", "datasets", "numpy"}
PACKAGES = ["hf_defer"] + sorted(f"hf_defer.{path.parent.name}" for path in PACKAGE.glob("*/__init__.py"))


def fresh(code: str) -> dict:
    """Runs `code` in a fresh interpreter (this checkout's hf_defer first) and returns the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_its_subpackages_and_the_command_line_loads_no_heavy_library():
    imports = "; ".join(f"import {name}" for name in PACKAGES + ["hf_defer.commands.cli", "hf_defer.commands.flags"])
    found = fresh(f"import json, sys; {imports}; "
                  f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {HEAVY!r})))")
    assert found == []
    # and reading one name imports its module, and no more of hf_defer than that module needs
    found = fresh("import json, sys, hf_defer; hf_defer.DeferralConfig; "
                  "print(json.dumps(sorted(m for m in sys.modules if m.startswith('hf_defer.'))))")
    assert "hf_defer.modeling.configuration_deferral" in found
    assert not [name for name in found if name.startswith(("hf_defer.training", "hf_defer.data", "hf_defer.hub"))]


def exports_and_type_checking_imports(package: str) -> tuple[dict[str, str], dict[str, str]]:
    """The package's `_EXPORTS` (name -> module, relative) and what its `if TYPE_CHECKING:` block imports (the same
    form), both read from the source."""
    path = PACKAGE.parent / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    table = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "_EXPORTS")
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
                 "TYPE_CHECKING")
    imported = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert all(isinstance(node, ast.ImportFrom) and node.level == 1 for node in block.body), package
    return table, imported


@pytest.mark.parametrize("package", PACKAGES)
def test_each_table_is_its_type_checking_imports_and_every_name_resolves(package):
    table, imported = exports_and_type_checking_imports(package)
    assert table == imported
    module = importlib.import_module(package)
    assert module.__all__ == list(table) and set(table) <= set(dir(module))
    for name, source in table.items():
        value = getattr(module, name)
        assert value is getattr(importlib.import_module(f"{package}.{source}"), name)
    with pytest.raises(AttributeError, match=f"module {package!r} has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


REGISTERED = """
import json
from transformers import AutoConfig, AutoModel
from transformers.models.auto.modeling_auto import MODEL_MAPPING
from transformers.pipelines import PIPELINE_REGISTRY
config = AutoConfig.for_model("deferral", feature_size=4)
tasks = PIPELINE_REGISTRY.supported_tasks
print(json.dumps([type(config).__module__, MODEL_MAPPING[type(config)].__name__,
                  tasks["deferral"]["impl"].__module__, tasks["deferral"]["pt"][0].__name__,
                  tasks["deferral-cascade"]["impl"].__name__]))
"""
EXPECTED = ["hf_defer.modeling.configuration_deferral", "EncoderForDeferral", "hf_defer.modeling.pipeline_deferral",
            "AutoModelForDeferral", "DeferralCascadePipeline"]


@pytest.mark.parametrize("before", [
    "", "from transformers import pipeline\n",
    # each a fresh interpreter importing torch (~5 s): make test-slow
    pytest.param("import transformers\n", marks=pytest.mark.slow),
    pytest.param("from transformers import AutoConfig\n", marks=pytest.mark.slow),
])
def test_after_a_bare_import_transformers_auto_classes_and_pipeline_know_the_deferral_model(before):
    """hf_defer imported before transformers, after its top module, after its config registry, after its pipelines."""
    assert fresh(f"{before}import hf_defer\n{REGISTERED}") == EXPECTED


def test_a_saved_folder_loads_through_the_auto_classes_and_the_pipeline_after_a_bare_import(tmp_path):
    code = f"""
import json
import hf_defer
from transformers import AutoConfig, AutoModel, pipeline
from hf_defer.modeling.modeling_deferral import EncoderForDeferral
from hf_defer.modeling.configuration_deferral import DeferralConfig
EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=1)).save_pretrained({str(tmp_path)!r})
model = AutoModel.from_pretrained({str(tmp_path)!r})
decide = pipeline("deferral", model={str(tmp_path)!r})
out = decide([0.5, -0.5, 0.25, 1.0], available_experts=[])
print(json.dumps([AutoConfig.from_pretrained({str(tmp_path)!r}).model_type, type(model).__name__,
                  type(hf_defer.AutoModelForDeferral.from_pretrained({str(tmp_path)!r})).__name__,
                  type(decide).__name__, out["defer"]]))
"""
    assert fresh(code) == ["deferral", "EncoderForDeferral", "EncoderForDeferral", "DeferralPipeline", False]


def test_model_experts_and_the_card_are_the_librarys_whatever_was_imported():
    """The pipeline's `experts=` and a model's `push_to_hub` reach the library's functions by name when called, in a
    process that imported only the modeling modules (no `import hf_defer` wiring them in)."""
    code = """
import json
import numpy as np
from hf_defer.modeling.configuration_deferral import DeferralConfig
from hf_defer.modeling.modeling_deferral import EncoderForDeferral
from hf_defer.modeling.pipeline_deferral import DeferralPipeline
import torch
torch.manual_seed(0)
model = EncoderForDeferral(DeferralConfig(feature_size=2, num_labels=2, num_experts=1, expert_names=["bot"])).eval()
with torch.no_grad():
    model.head[-1].weight.zero_(); model.head[-1].bias.copy_(torch.tensor([0.0, 0.0, 5.0]))  # always defer to bot
decide = DeferralPipeline(model=model, experts={"bot": lambda inputs: ["LABEL_1"] * len(inputs)})
out = decide([[0.0, 1.0], [1.0, 0.0]])
print(json.dumps([[row["defer"], row["expert"], row["label"]] for row in out]))
"""
    assert fresh(code) == [[True, "bot", "LABEL_1"], [True, "bot", "LABEL_1"]]


@pytest.mark.parametrize("module", ["hf_defer._lazy", "hf_defer.modeling.library_mode", "hf_defer.commands.flags",
                                    "hf_defer.experts.cache"])
def test_the_docstring_examples_run(module):
    import doctest

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed, result
