"""The coordinator dashboard (``GET /``) in real headless Chromium, against a
real uvicorn on 127.0.0.1: nodes and jobs appear as they are registered and submitted,
and clicking a job shows its tasks, events and artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.browser import severe_log_entries, wait_for
from tests.integration.test_service_app import _finish, job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = [pytest.mark.browser, pytest.mark.service]
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def _text(driver: Any, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text


def test_dashboard_shows_the_fleet_and_a_jobs_detail(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        browser.get(url + "/")
        wait_for(browser, lambda d: "updated" in _text(d, "#status"), what="the first refresh")
        assert "none" in _text(browser, "#nodes")

        api.post("/v1alpha1/nodes/register", json=registration("node-a")).raise_for_status()
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2)).json()["job_id"]
        wait_for(browser, lambda d: "node-a" in _text(d, "#nodes") and job_id in _text(d, "#jobs"),
                 what="the node and the job")
        assert "online" in _text(browser, "#nodes") and "2 pending" in _text(browser, "#jobs")

        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        _finish(api, lease)
        browser.find_element(By.CSS_SELECTOR, f'tr.job[data-job="{job_id}"]').click()
        wait_for(browser, lambda d: "COMPLETED" in _text(d, "#tasks"), what="the job's tasks")
        assert "TASK_COMMIT_ACCEPTED" in _text(browser, "#events")
        assert "metrics.json" in _text(browser, "#artifacts")
        wait_for(browser, lambda d: "1 completed" in _text(d, "#jobs"), what="the job's task counts")
        assert not severe_log_entries(browser)


def test_artifact_links_escape_hash_question_mark_and_percent_in_keys(browser: Any, tmp_path: Path) -> None:
    """A key's '#', '?' and '%' belong to the key: each link fetches exactly its artifact."""
    from selenium.webdriver.common.by import By

    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
        names = {"a#b.txt": b"hash", "c?d=1.txt": b"query", "e%20f.txt": b"percent", "g h.txt": b"space"}
        for name, content in names.items():
            encoded = "/".join(quote(part, safe="") for part in f"jobs/{job_id}/trial-000/{name}".split("/"))
            assert api.put(f"/v1alpha1/artifacts/{encoded}", content=content).status_code == 200
        browser.get(url + "/")
        wait_for(browser, lambda d: job_id in _text(d, "#jobs"), what="the job")
        browser.find_element(By.CSS_SELECTOR, f'tr.job[data-job="{job_id}"]').click()
        wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#artifacts a")) == len(names),
                 what="the artifact links")
        links = {a.text: a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "#artifacts a")}
        for name, content in names.items():
            href = links[f"jobs/{job_id}/trial-000/{name}"]
            assert "#" not in href and "?" not in href, href
            fetched = httpx.get(href, timeout=10)
            assert (fetched.status_code, fetched.content) == (200, content), href
        assert not severe_log_entries(browser)


def test_with_tokens_the_dashboard_shows_nothing_until_it_is_given_one(
        browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from selenium.webdriver.common.by import By

    monkeypatch.setenv("FLASHML_NODE_TOKENS", "node-a:tok-node")
    monkeypatch.setenv("FLASHML_SUBMITTER_TOKENS", "alice:tok-alice")
    monkeypatch.setenv("FLASHML_OPERATOR_TOKENS", "root:tok-root")

    def rows(driver: Any, table: str) -> list[str]:
        return [tr.text for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")]

    def use_token(token: str) -> None:
        field = browser.find_element(By.ID, "token")
        field.clear()
        field.send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#auth button[type=submit]").click()

    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        api.post("/v1alpha1/nodes/register", json=registration(), headers={"Authorization": "Bearer tok-node"})
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1),
                          headers={"Authorization": "Bearer tok-alice"}).json()["job_id"]
        browser.get(url + "/")
        wait_for(browser, lambda d: "needs a token" in _text(d, "#status"), what="the request for a token")
        assert rows(browser, "nodes") == [] and rows(browser, "jobs") == []
        assert job_id not in browser.page_source

        use_token("not-a-token")
        wait_for(browser, lambda d: "this token is refused" in _text(d, "#status"), what="the refusal")
        assert rows(browser, "jobs") == []

        use_token("tok-alice")  # a submitter: its own jobs, but not the node list
        wait_for(browser, lambda d: job_id in _text(d, "#jobs"), what="alice's job")
        assert "needs an operator token" in _text(browser, "#nodes")

        use_token("tok-root")
        wait_for(browser, lambda d: "node-a" in _text(d, "#nodes"), what="the node list")
        browser.find_element(By.CSS_SELECTOR, f'tr.job[data-job="{job_id}"]').click()
        wait_for(browser, lambda d: "trial-000" in _text(d, "#tasks"), what="the job's tasks")
        assert browser.execute_script("return sessionStorage.getItem('flashruntime-token')") == "tok-root"

        browser.find_element(By.ID, "forget").click()
        wait_for(browser, lambda d: "needs a token" in _text(d, "#status"), what="the token forgotten")
        assert rows(browser, "jobs") == [] and rows(browser, "tasks") == []
