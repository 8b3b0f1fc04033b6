"""MkDocs hook: the docstrings' Hugging Face-style references, [`name`], as links in the built site.

The docstrings name other objects as transformers' do (`[`certify_threshold`]`, `[`~hf_defer.data.load_hatespeech`]`,
`[`DeferralSurrogate.decide`]`), which Markdown leaves as bracketed text. After the build, each one whose name is an
object documented on an API page (an anchor `hf_defer....`) becomes a link to it; a name that is not documented
(a private helper, another library's class) keeps its code text without the brackets.

The parameter types are written the same way, `` (`int`, *optional*, defaults to 2) ``, which griffe keeps as one
string in a code span; they are shown as the Hugging Face documentation shows them (code for the types, *optional* in
italics).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

REFERENCE = re.compile(r"\[<code>~?([A-Za-z_][\w.]*)</code>\]")
ANCHOR = re.compile(r'id="(hf_defer\.[\w.]+)"')
HF_TYPE = re.compile(r"\(<code>([^<]*`[^<]*)</code>")  # then ")" or ", default: <code>None</code>)"


def _hf_type(match: re.Match) -> str:
    text = re.sub(r"`([^`]*)`", r"<code>\1</code>", match.group(1))
    return "(" + re.sub(r"\*([^*\s][^*]*)\*", r"<em>\1</em>", text)


def _anchors(site: Path) -> dict[str, tuple[Path, str]]:
    """Every documented object's anchor -> (its page, the anchor); the first page wins (a name documented twice)."""
    found: dict[str, tuple[Path, str]] = {}
    for page in sorted((site / "reference").rglob("*.html")):
        for anchor in ANCHOR.findall(page.read_text(encoding="utf-8")):
            found.setdefault(anchor, (page, anchor))
    return found


def resolve(name: str, anchors: dict[str, tuple[Path, str]]) -> tuple[Path, str] | None:
    """The anchor a reference names: the full path, `hf_defer.<name>`, or the one anchor that ends with `.<name>`."""
    for candidate in (name, f"hf_defer.{name}"):
        if candidate in anchors:
            return anchors[candidate]
    matches = sorted({anchor for anchor in anchors if anchor.endswith(f".{name}")}, key=len)
    return anchors[matches[0]] if len(matches) == 1 or (matches and matches[0].count(".") < matches[1].count(".")) \
        else None


def link_references(site: Path) -> int:
    """Rewrite the references of every page of `site`; returns how many became links."""
    anchors = _anchors(site)
    linked = 0
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if "[<code>" not in text and "`" not in text:
            continue
        text = HF_TYPE.sub(_hf_type, text)

        def replace(match: re.Match) -> str:
            nonlocal linked
            name = match.group(1)
            shown = name.rsplit(".", 1)[-1] if match.group(0).startswith("[<code>~") else name
            target = resolve(name, anchors)
            if target is None:
                return f"<code>{shown}</code>"
            linked += 1
            href = os.path.relpath(target[0], page.parent).replace(os.sep, "/")
            if target[0] == page:
                href = ""
            elif href.endswith("index.html"):  # directory URLs: ../training/, as the navigation writes them
                href = href[: -len("index.html")] or "./"
            return f'<a class="autorefs autorefs-internal" href="{href}#{target[1]}"><code>{shown}</code></a>'

        page.write_text(REFERENCE.sub(replace, text), encoding="utf-8")
    return linked


def on_post_build(config: Any, **kwargs: Any) -> None:
    link_references(Path(config["site_dir"]))
