"""Data shipped inside the package: the HateSpeech tweets, the ConvAbuse splits and RouteLLM's MMLU results,
checksum-verified.

The files live in ``hf_defer/data/bundled/`` as gzip copies of the upstream files (sources, commits, licenses and checksums
in ``hf_defer/data/bundled/README.md``). Every read decompresses the file and compares the SHA-256 of the decompressed bytes
with the upstream checksum, so a truncated or edited copy raises instead of producing silently wrong data. Upstream files
that belong together (RouteLLM's 58 MMLU files) ship as one gzip'd tar: [`bundled_tar_members`] checks the tar's checksum
and then every member's against its upstream checksum.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUNDLED_FILES", "BundledFile", "bundled_bytes", "bundled_path", "bundled_tar_members"]

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
    **{
        f"convabuse/ConvAbuseEMNLP{split}.csv": BundledFile(
            f"convabuse/ConvAbuseEMNLP{split}.csv.gz",
            sha256,
            f"github.com/amandacurry/convabuse 2_splits/ConvAbuseEMNLP{split}.csv "
            "@ c0a9469f48956e868276c605d499010ea3c7c0d0 (CC BY 4.0)",
        )
        for split, sha256 in (
            ("train", "23abab3eff791d0e8cac681cec15a5ef299ed052699e4fca762d1d4640c36936"),
            ("valid", "a28bc3083fe3ea305b8c417539a20fda7e68057dc06365507b85c46b60e65443"),
            ("test", "8387d70332cd2245a095240534629152dd5729e8e9556e91b6b20dabdc0bb9d0"),
        )
    },
    # Not an upstream file: a tar of 58 upstream files, built by scripts/pack_routellm_mmlu.py; each member is checked
    # against its upstream SHA-256 (hf_defer.data.routellm_mmlu.ROUTELLM_MMLU_MEMBER_SHA256) by `bundled_tar_members`.
    "routellm-mmlu/routellm_mmlu.tar": BundledFile(
        "routellm-mmlu/routellm_mmlu.tar.gz",
        "9033912e774d7c1b6a31cdfb4603f55ac28fac201e781ec10ebb7ceea56c4456",
        "github.com/lm-sys/RouteLLM routellm/evals/mmlu/{responses/*.csv,contaminated_prompts.jsonl} "
        "@ 0b64fdafe049e596a3f5657c219329f24af24198 (Apache-2.0), packed by scripts/pack_routellm_mmlu.py",
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


def bundled_tar_members(name: str, member_sha256: Mapping[str, str]) -> dict[str, bytes]:
    """The members of a shipped tar, each checked against the SHA-256 of the upstream file it copies.

    Args:
        name (`str`): a key of [`BUNDLED_FILES`] naming a tar, e.g. ``"routellm-mmlu/routellm_mmlu.tar"``.
        member_sha256 (`Mapping[str, str]`): every member's name in the tar -> its upstream SHA-256.

    Returns:
        `dict[str, bytes]`: member name -> the upstream file, byte for byte.

    Raises:
        `FileNotFoundError`: the package was installed without its data.
        `OSError`: the tar is damaged, a member is missing, unexpected or does not match its checksum.

    Example:

    ```python
    >>> from hf_defer.data.bundled_data import bundled_tar_members
    >>> from hf_defer.data.routellm_mmlu import ROUTELLM_MMLU_MEMBER_SHA256
    >>> members = bundled_tar_members("routellm-mmlu/routellm_mmlu.tar", ROUTELLM_MMLU_MEMBER_SHA256)
    >>> len(members), members["responses/mmlu_anatomy.csv"][:6]
    (58, b'prompt')

    ```
    """
    data, where = bundled_bytes(name), os.fspath(bundled_path(name))
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for info in archive.getmembers():
                if not info.isfile() or info.name not in member_sha256 or info.name in members:
                    raise OSError(f"unexpected member {info.name!r}")
                members[info.name] = archive.extractfile(info).read()
    except (OSError, tarfile.TarError) as error:
        raise OSError(f"the shipped archive {where!r} is damaged ({error}); reinstall hf_defer.") from error
    missing = sorted(set(member_sha256) - set(members))
    if missing:
        raise OSError(f"the shipped archive {where!r} lacks {missing}; reinstall hf_defer.")
    for member, content in members.items():
        digest = hashlib.sha256(content).hexdigest()
        if digest != member_sha256[member]:
            raise OSError(f"{member!r} in the shipped archive {where!r} does not match its upstream checksum (expected "
                          f"SHA-256 {member_sha256[member]}, got {digest}); reinstall hf_defer.")
    return members
