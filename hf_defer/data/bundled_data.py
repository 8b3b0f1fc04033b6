"""Data shipped inside the package: the HateSpeech tweets and the TwitterAAE dialect model, checksum-verified.

The files live in ``hf_defer/data/bundled/`` as gzip copies of the upstream files (sources, commits, licenses and checksums
in ``hf_defer/data/bundled/README.md``). Every read decompresses the file and compares the SHA-256 of the decompressed bytes
with the upstream checksum, so a truncated or edited copy raises instead of producing silently wrong data.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUNDLED_FILES", "BundledFile", "bundled_bytes", "bundled_path"]

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


@dataclass(frozen=True)
class BundledFile:
    """One shipped file: where it lies in the package and what it must decompress to."""

    path: str
    """Path relative to ``hf_defer/data/bundled/`` of the gzip file."""
    sha256: str
    """SHA-256 of the decompressed bytes (the upstream file's checksum)."""
    source: str
    """Upstream repository, path and commit."""


BUNDLED_FILES: dict[str, BundledFile] = {
    "hatespeech/labeled_data.csv": BundledFile(
        "hatespeech/labeled_data.csv.gz",
        "fcb8bc7c68120ae4af04a5b9acd58585513ede11e1548ebf36a5c2040b6f6281",
        "github.com/t-davidson/hate-speech-and-offensive-language data/labeled_data.csv "
        "@ cb50f7e9eb855a99abc51423bf40df0e26d6fe30 (MIT)",
    ),
    "twitteraae/model_count_table.txt": BundledFile(
        "twitteraae/model_count_table.txt.gz",
        "9907158995bea09301022050736bb91dda71bd577af9d3e643ae434d5c3fbf4e",
        "github.com/slanglab/twitteraae model/model_count_table.txt @ db4d6d126ca26b9bb9a70d7ce18bdd5833077523 (MIT)",
    ),
    "twitteraae/model_vocab.txt": BundledFile(
        "twitteraae/model_vocab.txt.gz",
        "6ef8e0ed59ed13776ad015a7dc14a0dd26a24ce9f6906edf860dfe40bf679133",
        "github.com/slanglab/twitteraae model/model_vocab.txt @ db4d6d126ca26b9bb9a70d7ce18bdd5833077523 (MIT)",
    ),
}
"""The shipped files, keyed by their upstream name."""


def bundled_path(name: str) -> Path:
    """The gzip file of a shipped data file (not verified: [`bundled_bytes`] verifies).

    Args:
        name (`str`): a key of [`BUNDLED_FILES`], e.g. ``"hatespeech/labeled_data.csv"``.

    Returns:
        `pathlib.Path`: the ``.gz`` file inside the installed package.
    """
    if name not in BUNDLED_FILES:
        raise ValueError(f"name must be one of {sorted(BUNDLED_FILES)}, got {name!r}.")
    return BUNDLED_DIR / BUNDLED_FILES[name].path


def bundled_bytes(name: str) -> bytes:
    """The decompressed bytes of a shipped data file, after checking their SHA-256 against the upstream checksum.

    Args:
        name (`str`): a key of [`BUNDLED_FILES`].

    Returns:
        `bytes`: the upstream file, byte for byte.

    Raises:
        `FileNotFoundError`: the package was installed without its data.
        `OSError`: the file is damaged (not valid gzip, or its checksum does not match).

    Example:

    ```python
    >>> from hf_defer.data.bundled_data import bundled_bytes
    >>> bundled_bytes("hatespeech/labeled_data.csv")[:40]
    b',count,hate_speech,offensive_language,ne'

    ```
    """
    path = bundled_path(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"the shipped data file {os.fspath(path)!r} is missing: hf_defer was installed without its package data. "
            "Reinstall it (pip install --force-reinstall hf-defer) or pass a local copy explicitly."
        )
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as error:
        raise OSError(f"the shipped data file {os.fspath(path)!r} is damaged ({error}); reinstall hf_defer.") from error
    digest = hashlib.sha256(data).hexdigest()
    expected = BUNDLED_FILES[name].sha256
    if digest != expected:
        raise OSError(
            f"the shipped data file {os.fspath(path)!r} does not match its upstream checksum (expected SHA-256 "
            f"{expected}, got {digest}); reinstall hf_defer."
        )
    return data
