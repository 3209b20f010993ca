"""Real headless Chromium for the page tests, driven through chromedriver (selenium).

Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them). Without them
a test skips locally, which under ``CI=true`` fails the run.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest


def _browser_paths() -> tuple[str, str]:
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("headless Chromium and chromedriver are not installed (Debian: apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    return browser, driver


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium session (selenium WebDriver), quit after the test."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _browser_paths()
    options = Options()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1600"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def severe_log_entries(driver: Any) -> list[dict[str, Any]]:
    """The browser console's errors (uncaught exceptions, failed requests)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(driver: Any, condition: Any, timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``condition(driver)`` until it is truthy (its value is returned) or ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition(driver)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


