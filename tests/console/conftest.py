"""A real browser for the console tests: Debian's headless Chromium driven by Selenium through
/usr/bin/chromedriver (no browser download), against a live `ovex serve` on loopback.

Where Chromium is missing and cannot be installed with apt-get, the tests are skipped with the reason;
`OVEX_REQUIRE_BROWSER=1` turns that skip into a failure (for CI machines that must run them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",  # running as root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def _unavailable(reason: str) -> None:
    if os.environ.get("OVEX_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser tests required (OVEX_REQUIRE_BROWSER=1) but {reason}")
    pytest.skip(reason)


def _install_chromium() -> str | None:
    """apt-get install chromium and its driver where we are root; an error text, or None."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "chromium/chromedriver are not installed and apt-get cannot run here (not root)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]
    for cmd in (["apt-get", "update", "-qq"], install):
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} timed out"
        if r.returncode != 0:
            return f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def chrome_options() -> Iterator[Any]:
    try:
        from selenium import webdriver
    except ImportError:
        _unavailable("selenium is not installed (pip install selenium)")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        err = _install_chromium()
        if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
            _unavailable(f"no headless Chromium: {err or 'chromium/chromedriver not found after install'}")
    profile = tempfile.mkdtemp(prefix="ovex-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument("--window-size=1280,1000")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    yield opts
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(chrome_options: Any) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=chrome_options)
    except Exception as exc:  # the binary exists but cannot start (missing libraries, ...)
        _unavailable(f"headless Chromium did not start: {exc}")
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
