"""The run page in real headless Chromium, driven through chromedriver.

A real ``flash.submit`` run writes metrics, a checkpoint and log lines while the page
polls; the browser must show them as they land, escape what the run printed, fetch
nothing from outside 127.0.0.1 and reach the offline docs.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flashruntime.viewer.server import RunViewerServer
from tests.browser import severe_log_entries, wait_for

pytestmark = pytest.mark.browser


TRAIN = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path
    from flashruntime.checkpoint.local import open_part, write_manifest

    out = Path(os.environ["FLASHML_OUTPUT_DIR"])
    ckpt = Path(os.environ["FLASHML_CKPT_DIR"])
    print("<img src=x onerror=window.__pwned=1> training starts", flush=True)
    for step in range(1, 7):
        with open(out / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps({"step": step, "loss": 1.0 / step, "ts": time.time()}) + "\\n")
        if step == 3:
            with open_part(ckpt / "step-000003", "model.pt") as part:
                part.write(b"weights")
            write_manifest(ckpt / "step-000003", job_id="local", attempt_id="task-000", step=3)
        print(f"step {step} done", flush=True)
        time.sleep(0.6)
    """
)


def _text(driver: Any, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text


def test_the_page_follows_a_live_run_to_the_end(browser: Any, tmp_path: Path) -> None:
    import flashruntime as flash

    (tmp_path / "train.py").write_text(TRAIN)
    run = flash.submit(flash.CommandWorkload(command=[sys.executable, "train.py"], source=flash.Source(path=str(tmp_path))),
                       output_dir=tmp_path / "out", wait=False, watch=False)
    with RunViewerServer(run.output_dir) as server:
        browser.get(server.url + "/")
        wait_for(browser, lambda d: "RUNNING" in _text(d, "#header"), what="the RUNNING badge")
        first_step = int(wait_for(browser, lambda d: _kpi(d, "step").isdigit() and _kpi(d, "step"),
                                   what="a step in the KPI strip"))
        assert run.wait(timeout=60).value == "SUCCEEDED"
        wait_for(browser, lambda d: "SUCCEEDED" in _text(d, "#header"), what="the SUCCEEDED badge")
        wait_for(browser, lambda d: _kpi(d, "step") == "6", what="the last step")
        assert first_step <= 6

        checkpoints = _text(browser, "#checkpoints")
        assert "step 3" in checkpoints and "hash verified" in checkpoints and "★" in checkpoints
        assert "1" in _kpi(browser, "verified checkpoints")
        events = _text(browser, "#events")
        assert "LAUNCH_STARTED" in events and "ATTEMPT_FINISHED" in events
        assert "task-000" in _text(browser, "#topology")
        assert "loss" in _text(browser, "#charts")

        logs = browser.execute_script("return document.querySelector('#logs').textContent")
        assert "<img src=x onerror=window.__pwned=1> training starts" in logs  # shown as text
        assert "step 6 done" in logs
        assert browser.execute_script("return window.__pwned === undefined")

        origins = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
        assert set(origins) <= {server.url}, origins  # nothing fetched from outside the viewer
        assert not severe_log_entries(browser)


def _kpi(driver: Any, label: str) -> str:
    """The value shown under a KPI label."""
    script = """
      const label = arguments[0];
      for (const box of document.querySelectorAll('#kpis *')) {
        if (box.children.length === 0 && box.textContent.trim() === label) {
          const value = box.nextElementSibling;
          return value ? value.textContent.trim() : '';
        }
      }
      return '';"""
    return driver.execute_script(script, label)


def test_an_unreadable_run_shows_why_and_the_docs_link_works(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with RunViewerServer(tmp_path) as server:  # no run.json here
        browser.get(server.url + "/")
        wait_for(browser, lambda d: "no run.json" in _text(d, "#status"), what="the error in the status line")
        browser.find_element(By.CSS_SELECTOR, 'a[href="/docs/"]').click()
        wait_for(browser, lambda d: "flashruntime documentation" in d.find_element(By.TAG_NAME, "h1").text,
                  what="the docs contents page")
        browser.find_element(By.LINK_TEXT, "Recovery tables").click()
        wait_for(browser, lambda d: "coordinated_training" in d.find_element(By.TAG_NAME, "main").text,
                  what="the recovery page")
