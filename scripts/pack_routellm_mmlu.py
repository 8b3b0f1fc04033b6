"""Build hf_defer/data/bundled/routellm-mmlu/routellm_mmlu.tar.gz from RouteLLM's MMLU results, byte for byte.

    git clone https://github.com/lm-sys/RouteLLM && git -C RouteLLM checkout 0b64fdafe049e596a3f5657c219329f24af24198
    python scripts/pack_routellm_mmlu.py RouteLLM/routellm/evals/mmlu

Every upstream file (57 `responses/mmlu_<subject>.csv` and `contaminated_prompts.jsonl`) is checked against the SHA-256
recorded in `hf_defer.data.routellm_mmlu.ROUTELLM_MMLU_MEMBER_SHA256` and stored unchanged in a tar (USTAR, members in
sorted order, mtime 0, owner 0/0, mode 0644), gzip-compressed at level 9 with no name and mtime 0 (like `gzip -9 -n`).
The same input gives the same bytes, so the SHA-256 of the decompressed tar printed here is the one recorded in
`hf_defer.data.bundled_data.BUNDLED_FILES["routellm-mmlu/routellm_mmlu.tar"]`.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import tarfile
from pathlib import Path

from hf_defer.data.routellm_mmlu import ROUTELLM_MMLU_MEMBER_SHA256

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "hf_defer" / "data" / "bundled" / "routellm-mmlu" / "routellm_mmlu.tar.gz"


def tar_bytes(folder: Path) -> bytes:
    """The uncompressed tar of the upstream files, after checking each one's SHA-256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name in sorted(ROUTELLM_MMLU_MEMBER_SHA256):
            data = (folder / name).read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest != ROUTELLM_MMLU_MEMBER_SHA256[name]:
                raise SystemExit(f"{folder / name}: SHA-256 {digest}, expected {ROUTELLM_MMLU_MEMBER_SHA256[name]} "
                                 "(not RouteLLM @ 0b64fda).")
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), 0, 0o644, 0, 0, "", ""
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="RouteLLM's routellm/evals/mmlu folder (at commit 0b64fda)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    data = tar_bytes(args.folder)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("wb") as handle, gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=handle,
                                                         mtime=0) as stream:
        stream.write(data)
    print(f"{args.output}: {args.output.stat().st_size} bytes; tar {len(data)} bytes, "
          f"SHA-256 of the decompressed tar {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
