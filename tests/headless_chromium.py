"""Headless Chromium driven by Selenium through Debian's chromedriver, for the browser tests (the review loop's and
the documentation site's): offline (Selenium Manager neither downloads nor reports), a fresh profile per driver, and a
screenshot of the last page kept for a failed run."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000"]


@contextmanager
def chromium_driver(screenshot: Path, install_hint: str) -> Iterator[Any]:
    """A `selenium.webdriver.Chrome` on headless Chromium; the last page goes to `screenshot` when it closes. Without
    Chromium and its driver the test fails (never skips), saying what to install (`install_hint`)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("the browser test needs Debian's chromium and chromium-driver: apt-get install chromium "
                    f"chromium-driver{install_hint}")
    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium Manager: no statistics, no downloads
    os.environ.setdefault("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="hf_defer_chromium_")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.save_screenshot(str(screenshot))
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
