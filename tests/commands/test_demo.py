"""scripts/demo.py (`make demo`) on 48 synthetic tweets: the content warning comes before any tweet, the saved folder
is named by its absolute path, the upload command exists in the pinned huggingface_hub, the card states the licenses,
and a normal run raises no deprecation warning."""

from __future__ import annotations

import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
from huggingface_hub import ModelCard

import hf_defer.data

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["hate_speech", "offensive_language", "neither"]
WORDS = "good bad great awful fine movie plot actor boring fun".split()


def small_hatespeech(*args, **kwargs) -> datasets.DatasetDict:
    rng = np.random.default_rng(0)
    features = datasets.Features({"text": datasets.Value("string"), "labels": datasets.ClassLabel(names=NAMES),
                                  "expert_labels": datasets.Value("int64")})
    return datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"text": [f"tweet{i} " + " ".join(rng.choice(WORDS, size=5))
                                                    for i in range(n)],
                                           "labels": rng.integers(0, 3, n), "expert_labels": rng.integers(0, 3, n)},
                                          features=features)
        for split, n in (("train", 32), ("validation", 8), ("test", 8))})


def test_demo_warns_first_names_the_absolute_folder_and_the_upload_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hf_defer.data, "load_hatespeech", small_hatespeech)
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["demo.py", "--epochs", "1", "--output-dir", "demo_model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(ROOT / "scripts" / "demo.py"), run_name="__main__")
    assert done.value.code == 0
    out, err = capsys.readouterr()
    folder = (tmp_path / "demo_model").resolve()
    assert out.startswith("Content warning: the HateSpeech tweets")
    assert out.index("Content warning") < out.index("tweet0")  # before any tweet
    assert f"Done: the model, its card and test_metrics.json are in {folder}\n" in out
    assert f"hf upload <your-name>/hatespeech-defer {folder}" in out
    deprecations = [w for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))
                    and "transformers" in str(w.filename)]
    assert not deprecations, [str(w.message) for w in deprecations]
    assert "deprecated" not in err.lower()
    card = ModelCard.load(folder / "README.md")
    assert (card.data.license, card.data.language, card.data.library_name) == ("apache-2.0", "en", "hf-defer")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "HateSpeech (Davidson et al., 2017), MIT License" in card.text and "Apache-2.0" in card.text
    assert str(tmp_path) not in card.content
    # the upload command the demo prints exists in the huggingface_hub this project pins
    hf = Path(sys.executable).parent / "hf"
    help_text = subprocess.run([str(hf), "upload", "--help"], capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and "REPO_ID [LOCAL_PATH]" in help_text.stdout


def test_a_quick_run_writes_its_own_folder_and_never_replaces_a_fuller_model(tmp_path, monkeypatch, capsys):
    """`make demo DEMO_ARGS="--max-rows 3000"` next to the full demo's demo_model/ (issue 36), and alone (43.1)."""
    from script_loader import load_script

    demo = load_script("demo.py")
    monkeypatch.chdir(tmp_path)
    # no demo_model yet: a quick run writes it too, the folder the Quick start's pipeline block loads (issue 43.1)
    assert demo.default_output_dir(None) == "demo_model" and demo.default_output_dir(3000) == "demo_model"
    full = tmp_path / "demo_model"
    full.mkdir()
    (full / "model.safetensors").write_text("the full model")
    (full / demo.MARKER).write_text('{"max_rows": null, "epochs": 50.0}\n')
    assert demo.default_output_dir(None) == "demo_model"
    assert demo.default_output_dir(3000) == "demo_model_3000rows"  # next to a fuller model, a folder of its own
    # what may replace the full model, and what may not
    assert demo.output_refusal(full, None, 50.0, overwrite=False) is None  # an as-full run
    refusal = demo.output_refusal(full, 3000, 50.0, overwrite=False)
    assert refusal.startswith(f"{full} holds a fuller demo model (all tweets, 50 epochs) than this run would train "
                              "(3000 tweets, 50 epochs)") and "demo_model_3000rows" in refusal
    assert "fuller" in demo.output_refusal(full, None, 1.0, overwrite=False)  # fewer epochs
    assert demo.output_refusal(full, 3000, 50.0, overwrite=True) is None
    quick = tmp_path / "quick"
    quick.mkdir()
    (quick / demo.MARKER).write_text('{"max_rows": 3000, "epochs": 50.0}\n')
    assert demo.output_refusal(quick, 5000, 50.0, overwrite=False) is None  # more tweets: fuller
    assert "fuller" in demo.output_refusal(quick, 2000, 50.0, overwrite=False)
    older = tmp_path / "older"
    older.mkdir()
    (older / demo.MARKER).touch()  # an older demo's marker says nothing: all tweets, 50 epochs
    assert demo.output_refusal(older, None, 50.0, overwrite=False) is None
    assert "fuller" in demo.output_refusal(older, 3000, 50.0, overwrite=False)
    # the script itself: refused with one line and status 2, the full model untouched
    assert demo.main(["--max-rows", "3000", "--output-dir", "demo_model"]) == 2
    assert capsys.readouterr().err.startswith("demo_model holds a fuller demo model")
    assert (full / "model.safetensors").read_text() == "the full model"
