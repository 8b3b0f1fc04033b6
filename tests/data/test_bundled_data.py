"""Tests of hf_defer.data.bundled_data: the data shipped in the package, and that an installed wheel carries it."""

from __future__ import annotations

import doctest
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hf_defer.data.bundled_data as bundled

REPO_ROOT = Path(__file__).resolve().parents[2]
# The upstream checksums, as published with the offline copies (shared/data/SHA256SUMS.txt), typed in here.
UPSTREAM_SHA256 = {
    "hatespeech/labeled_data.csv": "fcb8bc7c68120ae4af04a5b9acd58585513ede11e1548ebf36a5c2040b6f6281",
}
UPSTREAM_SIZES = {"hatespeech/labeled_data.csv": 2_546_446}


@pytest.mark.parametrize("name", sorted(UPSTREAM_SHA256))
def test_shipped_files_decompress_to_the_upstream_bytes(name):
    raw = gzip.decompress(bundled.bundled_path(name).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == UPSTREAM_SHA256[name]
    assert len(raw) == UPSTREAM_SIZES[name]
    assert bundled.bundled_bytes(name) == raw


@pytest.mark.parametrize("folder, holder", [("hatespeech", "Tom Davidson")])
def test_each_data_set_ships_its_mit_license(folder, holder):
    text = (bundled.BUNDLED_DIR / folder / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") or "MIT License" in text.splitlines()[0:3]
    assert "Permission is hereby granted, free of charge" in text and holder in text


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="name must be one of"):
        bundled.bundled_bytes("hatespeech/other.csv")


def test_docstring_examples():
    result = doctest.testmod(bundled, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.slow  # make test-slow (CI): the quick suite stays under 3 minutes on 2 cores
def test_wheel_carries_the_data_and_loads_it_when_installed(tmp_path):
    """`pip wheel .` then `pip install` into a fresh folder: the installed package reads its own copy."""
    wheels, site, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    shutil.copytree(REPO_ROOT / "hf_defer", source / "hf_defer", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
                   check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("hf_defer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for entry in bundled.BUNDLED_FILES.values():
        assert f"hf_defer/data/bundled/{entry.path}" in names
    assert "hf_defer/data/bundled/hatespeech/LICENSE" in names
    assert not [name for name in names if "twitteraae" in name]  # the experiments' dialect model: research/data/
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True)
    script = ("import hf_defer, hf_defer.data as d;"
              "print(hf_defer.__file__); ds = d.load_hatespeech();"
              "print(sum(ds.num_rows.values()))")
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_DEFER_HATESPEECH", None)
    env.pop("HF_DEFER_TWITTERAAE", None)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env,
                         cwd=tmp_path).stdout.split()
    assert Path(out[0]).is_relative_to(site)  # the installed copy, not the checkout
    assert out[1:] == ["24783"]
