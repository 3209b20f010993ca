"""The benchmark row arithmetic and report honesty rules."""

from __future__ import annotations

import pytest

from benchmarks.report import SMOKE_LABEL, render_markdown
from benchmarks.rows import Target, judge, measured_row, quantile, skipped_row, summarize

HOST = {"hostname": "h", "cpu": "cpu", "cores": 2, "ram_gb": 24.0, "os": "Linux", "python": "3.11",
        "torch": None, "numpy": None, "gpu": None, "flashruntime": "0.5.0", "fs": "ext4"}


def test_summary_statistics() -> None:
    stats = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert stats == {"min": 1.0, "median": 3.0, "max": 5.0, "p10": pytest.approx(1.4), "p90": pytest.approx(4.6)}
    assert quantile([7.0], 0.9) == 7.0
    with pytest.raises(ValueError, match="at least one sample"):
        summarize([])


def test_ratio_is_median_over_comparator_median_unless_given() -> None:
    row = measured_row("s", "performance", "m", "ms", [2.0, 4.0, 6.0], comparator=("c", [1.0, 2.0, 3.0]))
    assert row["ratio"] == 2.0 and row["comparator"] == {"name": "c", "min": 1.0, "median": 2.0, "max": 3.0}
    explicit = measured_row("s", "performance", "m", "ms", [2.0], comparator=("c", [1.0]), ratio=0.5)
    assert explicit["ratio"] == 0.5
    assert measured_row("s", "performance", "m", "ms", [1.0])["ratio"] is None


@pytest.mark.parametrize("op, value, unit, met", [
    ("<=", 2.0, "x", True), ("<=", 1.9, "x", False),      # ratio targets
    (">=", 4.0, "ms", True), (">=", 4.1, "ms", False),    # absolute targets apply to the median
    ("==", 4.0, "ms", True),
])
def test_judge_applies_targets_on_the_reference_host(op: str, value: float, unit: str, met: bool) -> None:
    row = measured_row("s", "performance", "m", "ms", [3.0, 4.0, 5.0], comparator=("c", [2.0]),
                       target=Target(op, value, unit, "why"))  # type: ignore[arg-type]
    assert judge(dict(row), on_reference_host=True)["met"] is met
    assert judge(dict(row), on_reference_host=False)["met"] is None


def test_skipped_rows_carry_a_reason_and_no_figures() -> None:
    row = judge(skipped_row("s", "performance", "m", "ms", "torch not installed",
                            target=Target("<=", 1.0, "x", "why")), on_reference_host=True)
    assert row["status"] == "skipped" and row["skip_reason"] == "torch not installed"
    assert row["median"] is None and row["met"] is None and row["ratio"] is None


def _result(rows: list[dict], smoke: bool) -> dict:
    return {"schema": "bench_v1", "smoke": smoke, "created_at": "2026-01-01T00:00:00Z", "host": HOST, "rows": rows}


def test_report_refuses_thin_rows_outside_a_smoke_run() -> None:
    thin = measured_row("s", "performance", "m", "ms", [1.0, 2.0])
    with pytest.raises(ValueError, match="fewer than 3 repeats"):
        render_markdown(_result([thin], smoke=False))
    text = render_markdown(_result([thin], smoke=True))
    assert SMOKE_LABEL in text


def test_report_has_no_empty_section_and_shows_the_host() -> None:
    row = measured_row("s", "resilience", "faults_routed", "faults", [5.0, 5.0, 5.0])
    text = render_markdown(_result([row], smoke=False))
    assert "### Resilience" in text and "### Performance" not in text
    assert "filesystem ext4" in text and SMOKE_LABEL not in text


def test_report_gives_each_scenarios_host_pace_once() -> None:
    pace = {"before": {"cpu0": 12.5, "cpu1": 40.0}, "after": {"cpu0": 21.25, "cpu1": 22.0}}
    rows = [dict(measured_row("lease", "performance", m, "ms", [1.0, 2.0, 3.0]), host_pace_ms=pace) for m in "ab"]
    result = dict(_result(rows, smoke=False), host_pace_workload="a fixed loop")
    text = render_markdown(result)
    assert "reference workload (a fixed loop)" in text
    assert text.count("- lease: host pace (reference workload, ms per CPU) before: cpu0 12.5, cpu1 40.0; "
                      "after: cpu0 21.2, cpu1 22.0") == 1


def test_report_reads_the_first_unpinned_pace_form() -> None:
    row = dict(measured_row("lease", "performance", "m", "ms", [1.0, 2.0, 3.0]),
               host_pace_ms={"before": 22.3, "after": 20.4})
    assert "before: unpinned 22.3; after: unpinned 20.4" in render_markdown(_result([row], smoke=False))


def test_reference_workload_is_timed_on_every_cpu_and_restores_the_affinity() -> None:
    import os

    from benchmarks.pace import pace_by_cpu, reference_ms

    assert reference_ms(samples=3, iterations=200) > 0
    if not hasattr(os, "sched_getaffinity"):
        assert set(pace_by_cpu()) == {"any"}
        return
    allowed = os.sched_getaffinity(0)
    by_cpu = pace_by_cpu()
    assert set(by_cpu) == {f"cpu{cpu}" for cpu in allowed} and all(ms > 0 for ms in by_cpu.values())
    assert os.sched_getaffinity(0) == allowed


def test_pinned_to_quietest_cpu_pins_the_fastest_and_restores_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from benchmarks import pace

    if not hasattr(os, "sched_getaffinity"):
        monkeypatch.setattr(pace, "pace_by_cpu", lambda: {"any": 21.0})
        with pace.pinned_to_quietest_cpu() as (label, ms):
            assert (label, ms) == ("any", 21.0)
        return
    allowed = os.sched_getaffinity(0)
    quietest = max(allowed)
    fake = {f"cpu{cpu}": (20.0 if cpu == quietest else 40.0 + cpu) for cpu in allowed}
    monkeypatch.setattr(pace, "pace_by_cpu", lambda: fake)
    with pace.pinned_to_quietest_cpu() as (label, ms):
        assert (label, ms) == (f"cpu{quietest}", 20.0)
        assert os.sched_getaffinity(0) == {quietest}
    assert os.sched_getaffinity(0) == allowed
    with pytest.raises(RuntimeError), pace.pinned_to_quietest_cpu():
        raise RuntimeError("a failing measurement still gives the CPUs back")
    assert os.sched_getaffinity(0) == allowed


def test_the_benchmarks_page_is_the_reference_results_rendered() -> None:
    from benchmarks import reference

    page = reference.DOCS_PAGE.read_text(encoding="utf-8")
    assert page == reference.render_page(reference.load_references()), (
        "docs/benchmarks.md is stale: run python -m benchmarks page")
