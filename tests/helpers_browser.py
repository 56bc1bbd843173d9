"""Headless Chromium from Debian's packages, driven by Selenium, for the viewer's page tests.

The browser and its driver are the system's (`apt-get install chromium
chromium-driver`), named explicitly, so Selenium never downloads one. Without
them the tests skip, saying so; under `CI=true` they fail instead (CI installs
them). The browser resolves no name but loopback: any request the page made
elsewhere would fail (and show as a console error).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

_BROWSERS = ("chromium", "chromium-browser")
_DRIVERS = ("chromedriver",)


def _find(names: tuple[str, ...], extra: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    for path in extra:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def chromium_paths() -> tuple[str, str]:
    """(browser, driver) executables, or skip (fail under CI=true) naming what is missing."""
    browser = _find(_BROWSERS, ("/usr/lib/chromium/chromium",))
    driver = _find(_DRIVERS, ("/usr/lib/chromium/chromedriver",))
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing = "selenium (pip install selenium, in the test extra)"
    else:
        missing = ", ".join(
            name
            for name, path in (("chromium", browser), ("chromium-driver", driver))
            if path is None
        )
        if missing:
            missing = f"{missing} (apt-get install chromium chromium-driver)"
    if missing:
        message = f"no headless browser for the page tests: {missing} is not installed"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI installs it in .ci/run")
        pytest.skip(message)
    return browser, driver


def start_chromium(width: int = 1440, height: int = 1180) -> Any:
    """A headless Chromium WebDriver with the console log kept (`get_log("browser")`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--metrics-recording-only",
        # Nothing but loopback resolves: a request elsewhere fails loudly.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--proxy-server=direct://",
        "--proxy-bypass-list=*",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver)
    return webdriver.Chrome(options=options, service=service)


def console_errors(driver: Any) -> list[str]:
    """The page's console messages of level SEVERE since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
