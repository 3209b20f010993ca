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


def _chart(driver: Any, name: str) -> dict[str, str]:
    """The data attributes of a chart: the ranges it draws, its lines and restart marks."""
    return driver.execute_script(
        "const svg = document.querySelector(`svg[data-chart='${arguments[0]}']`);"
        "return svg ? Object.assign({}, svg.dataset) : {};", name)


def test_a_restarted_demo_is_charted_from_its_first_step_to_its_last(browser: Any, tmp_path: Path) -> None:
    """The demo crashes at step 25 and resumes from the checkpoint at step 20: its loss
    curve runs 1 → 60 across both attempts, the restart marked where it begins."""
    import importlib.util
    import json
    import subprocess

    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "flashruntime.cli", "demo", "--json", "--output-dir", str(out)],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    events = json.loads((out / "run.json").read_text())["events"]
    assert any(e["message"].startswith("task-000-r1 resumes from step 20") for e in events), events
    with RunViewerServer(out) as server:
        browser.get(server.url + "/")
        loss = wait_for(browser, lambda d: _chart(d, "loss"), what="the loss chart")
        assert (loss["xMin"], loss["xMax"], loss["lines"], loss["breaks"]) == ("1", "60", "2", "task-000-r1")
        assert "2 attempts" in _text(browser, "#charts")
        assert browser.execute_script("return document.querySelectorAll('#charts line.brk').length") == 1
        assert _kpi(browser, "restarts") == "1 / 2" and _header(browser, "restarts") == "1 / 2"
        resources = _chart(browser, "resources")
        drawn = browser.execute_script(
            "return [...document.querySelectorAll('#charts polyline')].map(p => p.getAttribute('class'))")
        if importlib.util.find_spec("psutil") is not None:
            # Each attempt is shorter than one sampling period: its CPU comes from the closing reading.
            assert int(resources["ticks"]) >= 4 and "ln ln-cpu" in drawn and "ln ln-mem" in drawn
        else:
            assert "psutil is not installed" in _text(browser, "#charts")
        assert not severe_log_entries(browser)


TRIAL = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    lr = float(sys.argv[1])
    out = Path(os.environ["FLASHML_OUTPUT_DIR"])
    with open(out / "metrics.jsonl", "a") as handle:
        for step in range(1, 21):
            handle.write(json.dumps({"step": step, "loss": 1.0 / (1.0 + lr * step)}) + "\\n")
    (out / "metrics.json").write_text(json.dumps({"final_loss": 1.0 / (1.0 + lr * 20)}))
    """
)


def _header(driver: Any, label: str) -> str | None:
    """The value after a label in the header, None when the header has no such label."""
    return driver.execute_script(
        "const k = [...document.querySelectorAll('#hdr-body .k')].find(e => e.textContent === arguments[0]);"
        "return k ? k.parentElement.textContent.slice(k.textContent.length) : null;", label)


def _trial_rows(driver: Any) -> list[dict[str, str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#trials tr[data-trial]')].map(tr => ({id: tr.dataset.trial,"
        " params: tr.querySelector('td.params').textContent, text: tr.textContent, best: tr.className}))")


def test_a_sweep_shows_one_row_per_trial_with_its_parameters(browser: Any, tmp_path: Path) -> None:
    """A real fan-out of three trials: three rows with their parameters, three curves on one
    chart, no restarts; the same from a run.json without its ``sweep`` object (an older run)."""
    import json

    import flashruntime as flash

    (tmp_path / "trial.py").write_text(TRIAL)
    params = [{"lr": 0.1}, {"lr": 0.5}, {"lr": 2.0}]
    run = flash.submit(flash.CommandWorkload(
        command=[sys.executable, "trial.py", "{lr}"], source=flash.Source(path=str(tmp_path)), task_params=params,
        outputs=flash.OutputSpec(primary_metric="final_loss", maximize=False)),
        output_dir=tmp_path / "out", watch=False)
    assert run.state.value == "SUCCEEDED"
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    older = tmp_path / "older"  # run.json alone: its attempt rows point at the run's directories
    older.mkdir()
    (older / "run.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "sweep"}))
    for run_dir in [tmp_path / "out", older] if isinstance(doc.get("sweep"), dict) else [older]:
        with RunViewerServer(run_dir) as server:
            browser.get(server.url + "/")
            rows = wait_for(browser, lambda d: len(_trial_rows(d)) == 3 and _trial_rows(d), what="three trial rows")
            assert [r["id"] for r in rows] == ["local-000", "local-001", "local-002"]
            assert [r["params"] for r in rows] == ["lr=0.1", "lr=0.5", "lr=2"]
            assert all("SUCCEEDED" in r["text"] and "0 / 0" in r["text"] for r in rows)  # no restarts, each
            assert _header(browser, "trials") == "3" and _header(browser, "restarts") is None
            assert _kpi(browser, "trials done") == "3 / 3"
            loss = _chart(browser, "loss")
            assert (loss["lines"], loss["tasks"], loss["breaks"]) == ("3", "3", "")  # three trials, no restarts
            assert (loss["xMin"], loss["xMax"]) == ("1", "20")
            legend = browser.execute_script(
                "return [...document.querySelectorAll('#charts .legend [data-trial]')].map(e => e.textContent)")
            assert legend == ["local-000 lr=0.1", "local-001 lr=0.5", "local-002 lr=2"]
            assert browser.execute_script("return document.querySelectorAll('#topology [data-node^=\"trial:\"]')"
                                          ".length") == 3
            if run_dir == older:
                assert "metrics" in _text(browser, "#trials thead") and "final_loss=0.02439" in rows[2]["text"]
            else:  # the sweep names its metric and its best trial
                assert "final_loss (min)" in _text(browser, "#trials thead")
                assert [r["best"] for r in rows] == ["", "", "best"] and _header(browser, "best") == "local-002"
            assert not severe_log_entries(browser)
