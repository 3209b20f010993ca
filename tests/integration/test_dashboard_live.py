"""The dashboard of a job that is really running, in headless Chromium: a real uvicorn on
127.0.0.1 and a real ``flashruntime worker`` process running a command that writes step
records and prints a line per step. The task's curve and its log's tail render; its rows
read as links; a straggler the worker reported shows as a badge; Cancel on the page stops
the task's process within 2 s, and the worker logs a cancel, not a lost lease."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser import severe_log_entries, wait_for
from tests.integration.test_service_app import job_spec, registration
from tests.service_server import process_env, serve_in_thread, settings_for, stop_process

pytestmark = [pytest.mark.browser, pytest.mark.service, pytest.mark.slow]
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

# Touches the file the test names, then a step record and a line each 0.1 s, for minutes.
PROGRAM = """
import json, os, pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("started")
with open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.jsonl"), "a") as records:
    for step in range(1, 6000):
        loss = 2.0 / step
        records.write(json.dumps({"step": step, "loss": loss, "lr": 0.1, "ts": time.time()}) + "\\n")
        records.flush()
        print(f"step {step} loss {loss:.4f}", flush=True)
        time.sleep(0.1)
"""


def _command_job(started: Path) -> dict[str, Any]:
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "live"},
            "spec": {"workload": {"type": "command", "parameters": {
                "command": [sys.executable, "-c", PROGRAM, str(started)]}},
                "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-a"},
                "retryPolicy": {"maxTaskAttempts": 1}}}


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _task_pids(marker: Path) -> list[int]:
    """The live processes whose command line names ``marker``: the task and whatever wraps it
    (the sandbox runs it in a pid namespace of its own, so its own pid says nothing here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if os.fsencode(marker) in argv and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _text(driver: Any, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text


def _curve_points(driver: Any) -> int:
    from selenium.webdriver.common.by import By

    paths = driver.find_elements(By.CSS_SELECTOR, "#tasks svg.spark path")
    return paths[0].get_attribute("d").count("L") + 1 if paths else 0


def test_a_running_task_s_curve_and_log_render_and_cancel_stops_it_within_2_s(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    started = tmp_path / "started"
    worker = None
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        try:
            job_id = api.post("/v1alpha1/jobs", json=_command_job(started)).json()["job_id"]
            worker = subprocess.Popen(
                [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir", str(tmp_path / "work"),
                 "--runner", "trusted", "--pools", "team-a", "--node-id", "box-1", "--poll-seconds", "0.2",
                 "--log-upload-seconds", "0.5"],
                env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wait_for(None, lambda _: started.is_file(), timeout=60,
                     what="the task to start")
            pids = _task_pids(started)
            assert pids, "no process of the task found"

            browser.get(url + "/")
            wait_for(browser, lambda d: job_id in _text(d, "#jobs"), what="the job")
            row = browser.find_element(By.CSS_SELECTOR, f'tr.job[data-job="{job_id}"]')
            # Rows read as something to click: the pointer, a chevron, and the keyboard opens them too.
            assert browser.execute_script("return getComputedStyle(arguments[0]).cursor", row) == "pointer"
            assert row.find_element(By.CSS_SELECTOR, "td.go").text == "›"
            created = row.find_element(By.CSS_SELECTOR, "time")
            assert created.text in ("just now",) or created.text.endswith(" ago"), created.text
            assert created.get_attribute("datetime").startswith("20"), created.get_attribute("datetime")
            row.send_keys(Keys.ENTER)

            wait_for(browser, lambda d: _curve_points(d) >= 3, timeout=30, what="the task's curve")
            assert "loss" in _text(browser, "#tasks")
            task_id = browser.find_element(By.CSS_SELECTOR, "#tasks tr.task").get_attribute("data-task")
            browser.find_element(By.CSS_SELECTOR, f'tr.task[data-task="{task_id}"]').click()
            wait_for(browser, lambda d: "step " in _text(d, "#log") and " loss " in _text(d, "#log"),
                     timeout=30, what="the log's tail")
            assert browser.find_elements(By.CSS_SELECTOR, "#chart svg.chart path")
            keys = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "#keys button")]
            assert keys == ["loss", "lr"], keys
            assert len(_text(browser, "#log").splitlines()) <= 20

            browser.find_element(By.ID, "cancel").click()
            browser.switch_to.alert.accept()
            asked = time.monotonic()
            while any(_alive(pid) for pid in pids) and time.monotonic() - asked < 30:
                time.sleep(0.02)
            stopped_after = time.monotonic() - asked
            assert not any(_alive(pid) for pid in pids), "the task still runs 30 s after the cancel"
            print(f"the task stopped {stopped_after:.2f} s after the cancel")
            assert stopped_after <= 2.0, f"the task stopped {stopped_after:.2f} s after the cancel"
            wait_for(browser, lambda d: "CANCELLED" in _text(d, "#jobs"), what="the job cancelled")
            assert browser.find_element(By.ID, "cancel").is_displayed() is False
            assert not severe_log_entries(browser)
            time.sleep(1.5)  # what the worker says after the cancel, its next uploads included
        finally:
            log = stop_process(worker) if worker is not None else ""
    assert "cancelled on the coordinator" in log, log
    assert "lease lost" not in log and "refused" not in log and "abandoned" not in log, log


def test_a_straggler_shows_as_a_badge_on_its_task(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        api.post("/v1alpha1/nodes/register", json=registration("node-a")).raise_for_status()
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2)).json()["job_id"]
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        beat = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat", json={"stragglers": [
            {"rank": 1, "host": "node-a.local", "step": 40, "ratio": 2.04, "median_s": 0.2, "others_s": 0.098}]})
        assert beat.status_code == 200, beat.text
        browser.get(url + "/")
        wait_for(browser, lambda d: job_id in _text(d, "#jobs"), what="the job")
        browser.find_element(By.CSS_SELECTOR, f'tr.job[data-job="{job_id}"]').click()
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tasks .b-straggler"), what="the badge")
        badge = browser.find_element(By.CSS_SELECTOR, f'tr.task[data-task="{lease["task_id"]}"] .b-straggler')
        assert badge.text == "straggler: rank 1 2.0x on node-a"
        others = [tr for tr in browser.find_elements(By.CSS_SELECTOR, "#tasks tr.task")
                  if tr.get_attribute("data-task") != lease["task_id"]]
        assert others and not any(tr.find_elements(By.CSS_SELECTOR, ".badge") for tr in others)
        event = browser.find_element(By.CSS_SELECTOR, "#events tr.ev-alert")
        assert "STRAGGLER_DETECTED" in event.text and "rank 1" in event.text
        assert not severe_log_entries(browser)
