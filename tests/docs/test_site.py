"""The documentation site: it builds offline with --strict (a broken link, a missing reference or a docstring that
does not render fails), the API reference shows the public names with their signatures, and the command-line page
holds every flag of every `hf-defer` parser. The browser test (marked `browser`, `make test-docs`) searches the served
site in headless Chromium as a person would."""

from __future__ import annotations

import argparse
import functools
import html
import importlib
import inspect
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from headless_chromium import chromium_driver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(built_site):
    assert built_site.returncode == 0, f"mkdocs build --strict failed:\n{built_site.output[-6000:]}"
    return built_site.path


def _page_with_id(site: Path, anchor: str) -> Path:
    pages = [page for page in site.rglob("*.html") if f'id="{anchor}"' in page.read_text(encoding="utf-8")]
    assert pages, f"no page of the site has the anchor {anchor!r}"
    return pages[0]


def _text(markup: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def test_the_site_builds_offline_with_strict_and_has_every_page(site, built_site):
    assert "WARNING" not in built_site.output, built_site.output[-4000:]
    assert not (site / "hooks").exists(), "docs/hooks/ (build code) was published with the pages"
    for page in ("index.html", "guides/quickstart/index.html", "reference/cli/index.html",
                 "reference/api/guarantees/index.html", "search/search_index.json"):
        assert (site / page).is_file(), f"{page} was not built"
    # Offline: no page asks a font CDN or any other host for a stylesheet or a script.
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        remote = re.findall(r'<(?:link|script)[^>]+(?:href|src)="(https?://[^"]+)"', text)
        assert not remote, f"{page.relative_to(site)} loads {remote}"


def test_the_api_page_of_calibrate_deferral_shows_its_signature(site):
    from hf_defer import calibrate_deferral

    page = _page_with_id(site, "hf_defer.calibrate_deferral")
    text = page.read_text(encoding="utf-8")
    start = text.index('id="hf_defer.calibrate_deferral"')
    block = text.index("doc-signature", start)
    signature = " ".join(html.unescape(re.sub(r"<[^>]+>", "", text[text.index(">", block) + 1:
                                                                    text.index("</code>", block)])).split())
    assert "calibrate_deferral(" in signature
    # Every parameter, in order, as Python itself sees the function (the site reads the source, not the object).
    names = list(inspect.signature(calibrate_deferral).parameters)
    positions = [signature.find(name if name != "processor_kwargs" else "**processor_kwargs") for name in names]
    assert -1 not in positions, f"missing from the signature {signature!r}: {[n for n, p in zip(names, positions) if p < 0]}"
    assert positions == sorted(positions), signature
    assert "-> float" in signature


def test_the_docstrings_references_are_links_to_the_objects_they_name(site):
    """`[`certify_threshold`]` in calibrate_deferral's docstring links to certify_threshold's entry; no reference is
    left as bracketed text."""
    page = _page_with_id(site, "hf_defer.calibrate_deferral")
    text = page.read_text(encoding="utf-8")
    links = re.findall(r'<a[^>]+href="([^"]*)#hf_defer\.evaluation\.certify_threshold"', text)
    assert links, "calibrate_deferral's page does not link certify_threshold"
    target = (page.parent / links[0]).resolve() if links[0] else page
    assert 'id="hf_defer.evaluation.certify_threshold"' in target.read_text(encoding="utf-8")
    left = {str(page.relative_to(site)): re.findall(r"\[<code>[^<]*</code>\]", page.read_text(encoding="utf-8"))
            for page in site.rglob("*.html")}
    assert not any(left.values()), {page: found[:3] for page, found in left.items() if found}
    # HF-style parameter types, (`int`, *optional*, defaults to 2), are shown as code and italics, not raw backticks.
    assert "(<code>int</code>, <em>optional</em>" in (site / "reference" / "api" / "model" / "index.html").read_text(
        encoding="utf-8")
    raw = [page.relative_to(site).as_posix() for page in (site / "reference").rglob("*.html")
           if re.search(r"\(<code>[^<]*`", page.read_text(encoding="utf-8"))]
    assert not raw, f"parameter types left with raw backticks on {raw}"


def _public_names() -> dict[str, set[str]]:
    """Every name of `hf_defer.__all__` and of each subpackage's `__all__` (the subpackages found as
    tests/docs/test_docstrings.py finds them, not listed here) -> the paths its entry may have: each public path of the
    same object, and the module that defines it (a name a subpackage imports lazily, in its `__getattr__`, is
    documented where it is defined, as griffe reads the source)."""
    from test_docstrings import public_modules

    paths: dict[str, set[str]] = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            paths.setdefault(f"{module_name}.{name}", set()).add(f"{module_name}.{name}")
            if inspect.isclass(obj) or inspect.isroutine(obj):
                paths[f"{module_name}.{name}"].add(f"{obj.__module__}.{obj.__qualname__}")
    by_name: dict[str, set[str]] = {}
    for path, defined in paths.items():
        by_name.setdefault(path.rsplit(".", 1)[1], set()).update({path, *defined})
    return {path: by_name[path.rsplit(".", 1)[1]] for path in paths}


def test_every_public_name_has_a_reference_entry(site):
    """A name in `hf_defer.__all__` (or a subpackage's) is on an API page, under one of its public paths (a name that
    `hf_defer` and a subpackage both export is documented once)."""
    anchors = set()
    for page in (site / "reference" / "api").rglob("*.html"):
        anchors |= set(re.findall(r'id="(hf_defer\.[\w.]+)"', page.read_text(encoding="utf-8")))
    public = _public_names()
    assert {"hf_defer.modeling.get_surrogate", "hf_defer.inspection.check_deferral_model"} <= set(public)
    missing = [name for name, paths in public.items() if not paths & anchors]
    assert not missing, f"public names without an entry in docs/reference/api/: {missing}"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `hf-defer`, built as the command builds it (not through the docs hook)."""
    from hf_defer.commands import cli
    from hf_defer.commands.arguments import build_run_parser
    from hf_defer.commands.serve import build_serve_parser
    from hf_defer.commands.review import add_review_parser

    top = cli.build_parser()
    subparsers = next(action for action in top._actions if isinstance(action, argparse._SubParsersAction))
    parsers = {"hf-defer": top}
    parsers.update({f"hf-defer {name}": subparsers.choices[name] for name, command in cli.COMMANDS.items()
                    if command.add_arguments is not None})
    parsers["hf-defer train"] = build_run_parser(prog="hf-defer train")
    parsers["hf-defer serve"] = build_serve_parser()
    review = add_review_parser(argparse.ArgumentParser().add_subparsers())
    actions = next(action for action in review._actions if isinstance(action, argparse._SubParsersAction))
    parsers.update({f"hf-defer review {name}": parser for name, parser in actions.choices.items()})
    return parsers


def test_the_cli_page_holds_every_flag_of_every_parser(site):
    from hf_defer.commands.cli import COMMANDS

    text = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    sections = re.split(r'<h2 id="([\w-]+)"', text)
    by_anchor = {sections[i]: sections[i + 1] for i in range(1, len(sections) - 1, 2)}
    for name in COMMANDS:
        assert f"hf-defer-{name}" in by_anchor, f"no section for `hf-defer {name}`"
    missing = {}
    for title, parser in _parsers().items():
        section = by_anchor.get(re.sub(r"[^a-z0-9-]+", "-", title.lower()), "")
        codes = {html.unescape(code) for code in re.findall(r"<code>([^<]*)</code>", section)}
        flags = [flag for action in parser._actions for flag in action.option_strings]
        absent = [flag for flag in flags if flag not in codes]
        if absent:
            missing[title] = absent
    assert not missing, f"flags missing from their section of the command-line page: {missing}"
    assert "--json" in text  # the flag `hf-defer train` adds to the script's


@pytest.fixture
def served(site):
    """The built site on a free port of 127.0.0.1, as `mkdocs serve` or any static host would serve it."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def browser(tmp_path):
    with chromium_driver(tmp_path / "last_page.png", " (make test-docs does)") as driver:
        yield driver


@pytest.mark.browser
def test_a_reader_searches_missing_expert_and_finds_the_page_that_explains_it(site, served, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException])
    browser.get(f"{served}/")
    # The search box in the header, clicked and typed into as a reader does.
    box = wait.until(shown.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()
    box.send_keys("missing_expert")
    first = wait.until(shown.element_to_be_clickable((By.CSS_SELECTOR, ".md-search-result__item a")))
    first.click()
    wait.until(lambda driver: driver.current_url.rstrip("/") != served)
    body = wait.until(shown.presence_of_element_located((By.TAG_NAME, "article"))).text
    # The page the first result leads to says what missing_expert does: its choices, not only the word.
    assert "missing_expert" in body, f"{browser.current_url} does not mention missing_expert"
    assert all(choice in body for choice in ("error", "drop", "mask")), (
        f"{browser.current_url} mentions missing_expert without its choices (error, drop, mask)")

    page = _page_with_id(site, "hf_defer.calibrate_deferral").relative_to(site).parent.as_posix()
    browser.get(f"{served}/{page}/#hf_defer.calibrate_deferral")
    heading = wait.until(shown.visibility_of_element_located((By.ID, "hf_defer.calibrate_deferral")))
    signature = heading.find_element(By.XPATH, "following::*[contains(@class, 'doc-signature')][1]").text
    assert signature.startswith("calibrate_deferral("), signature
    assert "max_deferral_rate" in signature and "confidence" in signature and "-> float" in signature, signature
