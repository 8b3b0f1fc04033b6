"""Every public name (`hf_defer.__all__` and each subpackage's `__all__`) has a docstring with a `>>>` example, and the
examples run (doctest, with the options the package's other doctests use: `ELLIPSIS` for printed floats,
`NORMALIZE_WHITESPACE`).

Constants (`HATESPEECH_LABELS`, `SURROGATES`, ...) are data, not code: they carry no docstring of their own (the API
reference shows the comment under each in its module) and are left out. Examples of a name defined in a module whose
doctests another test already runs with `doctest.testmod` (`ALREADY_RUN`) are not run twice; a module renamed since
only makes its examples run here too, never skipped.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
import pkgutil
import re

import pytest

import hf_defer

OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
ALREADY_RUN = {
    # module: the test that runs `doctest.testmod` on it
    "hf_defer.evaluation.guarantees": "tests/evaluation/test_guarantees.py",
    "hf_defer.evaluation.thresholds": "tests/evaluation/test_guarantees.py",
    "hf_defer.inspection.adapters": "tests/inspection/test_inspection_docstrings.py",
    "hf_defer.inspection.model_checks": "tests/inspection/test_inspection_docstrings.py",
    "hf_defer.hub.model_card": "tests/evaluation/test_guarantees.py",
    "hf_defer.evaluation.evaluate_metric": "tests/evaluation/test_evaluate_metric.py",
    "hf_defer.evaluation.reliability": "tests/evaluation/test_reliability.py",
    "hf_defer.experts.embeddings": "tests/experts/test_embeddings.py",
    "hf_defer.experts.simulated": "tests/experts/test_simulated.py",
    "hf_defer.data.annotations": "tests/data/test_annotations.py",
    "hf_defer.data.collator": "tests/data/test_collator.py",
    "hf_defer.data.hatespeech": "tests/data/test_hatespeech.py",
    "hf_defer.data.imagenet16h": "tests/data/test_imagenet16h.py",
    "hf_defer.data.routellm_mmlu": "tests/data/test_routellm_mmlu.py",
    "hf_defer.review.labeling": "tests/review/test_simulated_reviewers.py",
    "hf_defer.review.tasks": "tests/review/test_simulated_reviewers.py",
    "hf_defer.review.answers": "tests/review/test_simulated_reviewers.py",
    "hf_defer.review.pulling": "tests/review/test_simulated_reviewers.py",
    "hf_defer.review.simulated": "tests/review/test_simulated_reviewers.py",
}


def public_modules() -> list[str]:
    """`hf_defer` and each of its subpackages that declares `__all__`."""
    names = ["hf_defer"]
    for info in pkgutil.iter_modules(hf_defer.__path__):
        if info.ispkg:
            try:
                module = importlib.import_module(f"hf_defer.{info.name}")
            except ImportError:  # an optional extra that is not installed: its names are checked where it is
                continue
            if hasattr(module, "__all__"):
                names.append(module.__name__)
    return names


def public_objects() -> list[tuple[str, object]]:
    """(`module.name`, object) of every class and function in a public `__all__` (constants left out)."""
    found = []
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isroutine(obj):
                found.append((f"{module_name}.{name}", obj))
    return found


class FencedDocTestParser(doctest.DocTestParser):
    """Doctest's parser for docstrings that wrap their examples in Markdown fences (```python ... ```), as
    transformers' do: a fence line ends the expected output above it, as a blank line does."""

    FENCE = re.compile(r"^[ \t]*```[\w-]*[ \t]*$", re.MULTILINE)

    def parse(self, string: str, name: str = "<string>") -> list:
        return super().parse(self.FENCE.sub("", string), name)


def _examples(obj: object) -> list[doctest.DocTest]:
    """The doctest of `obj`'s own docstring (not its methods': those are the module's), with its module's globals."""
    module = inspect.getmodule(obj)
    finder = doctest.DocTestFinder(parser=FencedDocTestParser(), recurse=False)
    return [test for test in finder.find(obj, getattr(obj, "__qualname__", repr(obj)), module=module,
                                         globs=dict(vars(module)) if module else {}) if test.examples]


def test_every_public_name_has_a_docstring_with_an_example():
    objects = public_objects()
    assert len(objects) > 50, f"only {len(objects)} public classes and functions found"
    without = sorted({name for name, obj in objects if ">>>" not in (inspect.getdoc(obj) or "")})
    assert not without, f"{len(without)} public names have no docstring with a >>> example: {', '.join(without)}"


def test_each_already_run_module_exists_and_its_test_runs_testmod_on_it():
    """A module renamed or a test moved must not leave `ALREADY_RUN` pointing at nothing (its examples would then be
    run by neither test)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for module_name, test in ALREADY_RUN.items():
        importlib.import_module(module_name)  # ModuleNotFoundError: renamed, update the entry
        path = os.path.join(root, test)
        assert os.path.isfile(path), f"{module_name}: {test} does not exist"
        with open(path, encoding="utf-8") as file:
            source = file.read()
        assert "testmod" in source and module_name.rsplit(".", 1)[1] in source, f"{test} does not testmod {module_name}"


def _to_run() -> list[tuple[str, object]]:
    seen, chosen = set(), []
    for name, obj in public_objects():
        if id(obj) in seen or getattr(obj, "__module__", None) in ALREADY_RUN:
            continue
        seen.add(id(obj))
        chosen.append((name, obj))
    return chosen


@pytest.mark.parametrize("name, obj", [pytest.param(name, obj, id=name) for name, obj in _to_run()])
def test_the_example_runs(name, obj, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a folder writes it here
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    environment = dict(os.environ)  # an example may set a variable (a token's name): undone below
    tests = _examples(obj)
    assert tests, f"{name}: no example to run"
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    os.environ.clear()
    os.environ.update(environment)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example lines failed (output above)"
