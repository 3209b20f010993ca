"""The coordinator's pure parts: settings, node registry, derived job state,
artifact keys and atomic writes, Prometheus rendering. No HTTP here."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flashruntime.coordinator.artifacts import (
    ArtifactConflict,
    ArtifactStore,
    ArtifactTooLarge,
    BadArtifactKey,
    check_key,
)
from flashruntime.coordinator.lease_jobs import derived_state, refreshed
from flashruntime.coordinator.metrics import Metrics
from flashruntime.coordinator.nodes import ONLINE_WINDOW_S, NodeRegistry
from flashruntime.coordinator.settings import RuntimeSettings, variables
from flashruntime.protocol.v1alpha1 import (
    EventType,
    JobRecord,
    JobSpec,
    JobState,
    NodeHeartbeat,
    NodeRegistration,
)

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in variables().values():
        monkeypatch.delenv(variable, raising=False)
    defaults = RuntimeSettings.from_env()
    assert (defaults.profile, defaults.ledger_path, defaults.artifacts_dir) == (
        "local", "/data/flashruntime.db", "/data/artifacts")
    assert (defaults.join_code, defaults.max_artifact_mb, defaults.sweep_interval_s, defaults.max_json_kb) == (
        None, 256, 2.0, 1024)
    assert (defaults.rate_limit_per_s, defaults.metrics_public, defaults.require_node_auth) == (None, False, False)
    env = {"FLASHML_PROFILE": "edge", "FLASHML_LEDGER_PATH": "/srv/x/ledger.db", "FLASHML_JOIN_CODE": "abc",
           "FLASHML_MAX_ARTIFACT_MB": "8", "FLASHML_SWEEP_INTERVAL_S": "0.25", "FLASHML_RATE_LIMIT": "0",
           "FLASHML_METRICS_PUBLIC": "1", "FLASHML_ENABLE_KUBERAY": "0"}  # the last one is no setting: ignored
    settings = RuntimeSettings.from_env(env)
    assert (settings.profile, settings.join_code, settings.max_artifact_mb, settings.sweep_interval_s) == (
        "edge", "abc", 8, 0.25)
    assert settings.rate_limit_for(enforcing=True) == 0.0 and settings.metrics_public is True
    assert settings.leases_path == Path("/srv/x/leases.db") and settings.checkpoints_path == Path("/srv/x/checkpoints.db")
    assert RuntimeSettings.from_env({}).profile == "local"  # a given mapping, not the process environment
    monkeypatch.setenv("FLASHML_PROFILE", "from-process-env")
    assert RuntimeSettings().profile == "from-process-env"  # read at construction
    assert RuntimeSettings(profile="given").profile == "given"  # a keyword wins


@pytest.mark.parametrize(("env", "match"), [
    ({"FLASHML_MAX_ARTIFACT_MB": "lots"}, "FLASHML_MAX_ARTIFACT_MB must be a whole number of MiB > 0, got 'lots'"),
    ({"FLASHML_MAX_ARTIFACT_MB": "0"}, "FLASHML_MAX_ARTIFACT_MB must be a whole number of MiB > 0, got '0'"),
    ({"FLASHML_SWEEP_INTERVAL_S": "inf"}, "FLASHML_SWEEP_INTERVAL_S must be a number of seconds, finite and > 0"),
    ({"FLASHML_METRICS_PUBLIC": "yes"}, "FLASHML_METRICS_PUBLIC must be 1 or 0, got 'yes'"),
    ({"FLASHML_RATE_LIMIT": "-1"}, "FLASHML_RATE_LIMIT must be a number of requests per second"),
])
def test_settings_refuse_malformed_values(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RuntimeSettings.from_env(env)


def _registration(node_id: str = "n1", pools: list[str] | None = None) -> NodeRegistration:
    return NodeRegistration(node_id=node_id, kubernetes_node="", hostname="h", module_capable=True,
                            local_datasets=["mnist"], capabilities={"cpu_cores": 4, "pools": pools or []})


def test_node_registry_liveness_pools_and_accepted_counts() -> None:
    clock = [1000.0]
    nodes = NodeRegistry(clock=lambda: clock[0])
    nodes.register(_registration("b"))
    nodes.register(_registration("a", pools=["p"]))
    assert nodes.heartbeat("ghost", NodeHeartbeat(node_id="ghost")) is False
    nodes.count_accepted("a")
    clock[0] += ONLINE_WINDOW_S - 0.5
    assert nodes.heartbeat("a", NodeHeartbeat(node_id="a", pools=["q", "r"])) is True
    assert nodes.heartbeat("b", NodeHeartbeat(node_id="b")) is True  # pools None: unchanged
    clock[0] += 1.0
    nodes.register(_registration("a", pools=["p"]))  # re-registration keeps the accepted count
    rows = nodes.views({"b": (None, "maintenance")}, T0)
    assert [r["node_id"] for r in rows] == ["a", "b"]
    assert (rows[0]["online"], rows[0]["accepted_tasks"], rows[0]["capabilities"]["pools"]) == (True, 1, ["p"])
    assert (rows[1]["online"], rows[1]["last_heartbeat_age_s"], rows[1]["cordon_reason"]) == (True, 1.0, "maintenance")
    clock[0] += ONLINE_WINDOW_S
    assert [r["online"] for r in nodes.views({}, T0)] == [False, False]
    lapsed = {"a": (T0 - timedelta(seconds=1), "old")}
    assert nodes.views(lapsed, T0)[0]["cordon_reason"] is None
    assert nodes.status_counts({"b": (T0 + timedelta(hours=1), "x")}, T0) == {"online": 0, "offline": 2, "cordoned": 1}
    view = nodes.claim_view("a")
    assert view is not None and view["local_datasets"] == ["mnist"] and view["module_capable"] is True
    assert view["capabilities"]["cpu_cores"] == 4 and nodes.claim_view("ghost") is None


def test_replicas_on_one_store_see_the_heartbeats_the_others_heard() -> None:
    """Two registries over one store, as two coordinator replicas over one database: a node
    heard only by the first is online for the second, from the heartbeat the first stored."""
    from flashruntime.coordinator.node_store import InMemoryNodeStore
    from flashruntime.coordinator.nodes import SEEN_WRITE_INTERVAL_S

    clock = [1000.0]
    store = InMemoryNodeStore()
    first, second = (NodeRegistry(store, clock=lambda: clock[0]) for _ in range(2))
    first.register(_registration("a"))
    assert [r["online"] for r in second.views({}, T0)] == [True]
    # the first replica keeps hearing the node; each heartbeat older than the write interval is stored
    for _ in range(6):
        clock[0] += SEEN_WRITE_INTERVAL_S / 2
        assert first.heartbeat("a", NodeHeartbeat(node_id="a")) is True
    (row,) = second.views({}, T0)
    assert row["online"] and row["last_heartbeat_age_s"] <= SEEN_WRITE_INTERVAL_S
    clock[0] += ONLINE_WINDOW_S
    assert [r["online"] for r in second.views({}, T0)] == [False]


@pytest.mark.parametrize(("counts", "state"), [
    ({}, JobState.PENDING),
    ({"PENDING": 1, "COMPLETED": 3}, JobState.RUNNING),
    ({"LEASED": 1, "FAILED": 1}, JobState.RUNNING),
    ({"FAILED": 1, "COMPLETED": 3}, JobState.FAILED),
    ({"FAILED": 1, "CANCELLED": 1}, JobState.FAILED),
    ({"COMPLETED": 4}, JobState.SUCCEEDED),
    ({"COMPLETED": 3, "CANCELLED": 1}, JobState.CANCELLED),
])
def test_derived_job_state(counts: dict[str, int], state: JobState) -> None:
    assert derived_state(counts) is state


def test_refresh_stamps_terminal_states_once_and_freezes_them() -> None:
    spec = JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {
        "execution": {"backend": "leases"}, "image": {"repository": "r", "tag": "1"},
        "workload": {"type": "hyperparameter_search", "parameters": {}}}})
    record = JobRecord(job_id="abc", spec=spec, state=JobState.RUNNING, backend="leases", created_at=T0, artifacts=[])
    same, event = refreshed(record, {"LEASED": 1}, T0)
    assert same is record and event is None
    done, event = refreshed(record, {"COMPLETED": 2}, T0 + timedelta(seconds=5))
    assert done.state is JobState.SUCCEEDED and done.finished_at == T0 + timedelta(seconds=5)
    assert event is not None and event.type is EventType.JOB_SUCCEEDED and event.source == "flashruntime.leases"
    assert refreshed(done, {"PENDING": 1}, T0) == (done, None)  # terminal records are frozen
    failed, event = refreshed(record, {"FAILED": 1, "COMPLETED": 1}, T0)
    assert failed.state is JobState.FAILED and event is not None and event.type is EventType.JOB_FAILED
    cancelled, event = refreshed(record, {"CANCELLED": 2}, T0)
    assert cancelled.state is JobState.CANCELLED and cancelled.finished_at == T0 and event is None


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a/./b", "a\\b", "a//b", "dir/", "a/.upload-x", "..", "a\x00b"])
def test_bad_artifact_keys(key: str) -> None:
    with pytest.raises(BadArtifactKey):
        check_key(key)


def test_good_artifact_keys() -> None:
    assert check_key("jobs/j/t/metrics.json") == "jobs/j/t/metrics.json" and check_key("a..b/c") == "a..b/c"


async def _chunks(*parts: bytes):
    for part in parts:
        yield part


def test_artifact_writes_are_atomic_bounded_and_listed(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_bytes=10)
    sha, size = asyncio.run(store.write("jobs/j/t/a.txt", _chunks(b"hello", b" you")))
    assert size == 9 and (tmp_path / "jobs/j/t/a.txt").read_bytes() == b"hello you"
    assert sha == hashlib.sha256(b"hello you").hexdigest()
    with pytest.raises(ArtifactTooLarge, match="larger than the coordinator's limit"):
        asyncio.run(store.write("jobs/j/t/a.txt", _chunks(b"0123456789", b"x")))
    assert (tmp_path / "jobs/j/t/a.txt").read_bytes() == b"hello you"  # the old content survives
    assert [p.name for p in (tmp_path / "jobs/j/t").iterdir()] == ["a.txt"]  # no temp file left behind
    asyncio.run(store.write("jobs/j/u/b.bin", _chunks(b"1")))
    asyncio.run(store.write("jobs/k/t/c.bin", _chunks(b"22")))
    assert store.list("jobs/j/") == [("jobs/j/t/a.txt", 9), ("jobs/j/u/b.bin", 1)]
    assert store.list("jobs/none/") == [] and store.read_path("jobs/j/t/missing") is None


def test_a_refused_commit_check_leaves_the_old_content_and_no_temp_file(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_bytes=100)
    asyncio.run(store.write("jobs/j/t/m.json", _chunks(b"old")))
    seen: list[bytes] = []

    def refuse() -> None:  # runs with the whole body on disk, before the rename
        seen.extend(p.read_bytes() for p in (tmp_path / "jobs/j/t").glob(".upload-*"))
        raise PermissionError("lease ended")

    with pytest.raises(PermissionError, match="lease ended"):
        asyncio.run(store.write("jobs/j/t/m.json", _chunks(b"ne", b"w"), commit_check=refuse))
    assert seen == [b"new"]
    assert (tmp_path / "jobs/j/t/m.json").read_bytes() == b"old"
    assert [p.name for p in (tmp_path / "jobs/j/t").iterdir()] == ["m.json"]
    asyncio.run(store.write("jobs/j/t/m.json", _chunks(b"new"), commit_check=lambda: None))
    assert (tmp_path / "jobs/j/t/m.json").read_bytes() == b"new"


def test_keys_that_clash_as_file_and_directory_are_conflicts(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_bytes=100)
    asyncio.run(store.write("col/a", _chunks(b"file")))
    asyncio.run(store.write("col2/d/e", _chunks(b"inner")))
    with pytest.raises(ArtifactConflict, match=r"'col/a/b' clashes with the existing artifact 'col/a'.*'col/a/'"):
        asyncio.run(store.write("col/a/b", _chunks(b"x")))
    with pytest.raises(ArtifactConflict, match="'col/a/x/y' clashes with the existing artifact 'col/a'"):
        asyncio.run(store.write("col/a/x/y", _chunks(b"x")))
    with pytest.raises(ArtifactConflict, match=r"'col2/d' clashes with existing artifacts under 'col2/d/' "
                                               r"\(such as 'col2/d/e'\).*choose another key"):
        asyncio.run(store.write("col2/d", _chunks(b"x")))
    assert (tmp_path / "col/a").read_bytes() == b"file" and (tmp_path / "col2/d/e").read_bytes() == b"inner"
    assert not [p for p in tmp_path.rglob(".upload-*")]


@pytest.mark.parametrize("prefix", ["jobs/../", "jobs/./", "../", "jobs//", "jobs/x"])
def test_listings_stay_inside_the_prefix_they_name(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(BadArtifactKey):
        ArtifactStore(tmp_path, max_bytes=1).list(prefix)


def test_metrics_render_prometheus_text() -> None:
    metrics = Metrics()
    metrics.count_claim("leased")
    metrics.count_claim("empty")
    metrics.count_commit("invalid_output")
    metrics.count_expiries(2)
    metrics.observe_request("GET", "/v1alpha1/jobs/{job_id}", 200, 0.003)
    metrics.observe_request("GET", "/v1alpha1/jobs/{job_id}", 200, 0.2)
    metrics.observe_request("GET", "/v1alpha1/jobs/{job_id}", 200, 60.0)
    text = metrics.render({"PENDING": 1, "LEASED": 0}, 0, {"online": 1, "offline": 0, "cordoned": 0})
    parser = pytest.importorskip("prometheus_client.parser")
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in parser.text_string_to_metric_families(text) for sample in family.samples}
    types = {family.name: family.type for family in parser.text_string_to_metric_families(text)}
    assert types["flashruntime_tasks"] == "gauge" and samples[("flashruntime_tasks", (("state", "PENDING"),))] == 1
    assert samples[("flashruntime_claims_total", (("result", "leased"),))] == 1
    assert samples[("flashruntime_commits_total", (("result", "invalid_output"),))] == 1
    assert samples[("flashruntime_lease_expiries_total", ())] == 2
    route = (("method", "GET"), ("route", "/v1alpha1/jobs/{job_id}"), ("status", "200"))

    def bucket(le: str) -> float:
        return samples[("flashruntime_http_request_duration_seconds_bucket", tuple(sorted((*route, ("le", le)))))]

    assert (bucket("0.005"), bucket("0.25"), bucket("10"), bucket("+Inf")) == (1, 2, 2, 3)
    assert samples[("flashruntime_http_request_duration_seconds_count", route)] == 3
    assert text.endswith("\n")


def test_dashboard_is_self_contained_and_polls_the_documented_routes() -> None:
    from flashruntime.coordinator.dashboard import DASHBOARD_HTML
    from flashruntime.viewer.page import TOKENS

    assert "http://" not in DASHBOARD_HTML and "https://" not in DASHBOARD_HTML and " src=" not in DASHBOARD_HTML
    for route in ("/v1alpha1/nodes", "/v1alpha1/jobs", "/tasks`", "/events`", "/artifacts`"):
        assert route in DASHBOARD_HTML
    assert "setInterval(refresh, 2000)" in DASHBOARD_HTML
    assert all(f"--{name}:{value};" in DASHBOARD_HTML for name, value in TOKENS.items())
    assert "%(" not in DASHBOARD_HTML  # every template slot was filled


def test_large_artifact_writes_span_several_blocks(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_bytes=8 << 20)
    parts = [bytes([i]) * (700 * 1024) for i in range(5)]  # 3.4 MiB in uneven chunks
    sha, size = asyncio.run(store.write("jobs/j/t/big.bin", _chunks(*parts)))
    whole = b"".join(parts)
    assert (size, sha) == (len(whole), hashlib.sha256(whole).hexdigest())
    assert (tmp_path / "jobs/j/t/big.bin").read_bytes() == whole
