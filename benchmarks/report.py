"""Markdown rendering of a ``bench_v1`` result: the host block, then one table per
section that has rows. Rows with fewer than 3 repeats are refused unless the whole
document is a labelled smoke run.
"""

from __future__ import annotations

from typing import Any

SMOKE_LABEL = "smoke run — not representative"
SECTIONS = ("performance", "resilience")


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        if magnitude >= 0.01:
            return f"{value:.3f}"
        return f"{value:.2e}"
    return str(value)


def _target(row: dict[str, Any]) -> str:
    target = row.get("target")
    if not target:
        return "—"
    return f"{target['op']} {_fmt(float(target['value']))} {target['unit']} ({target['source']})"


def _check_repeats(result: dict[str, Any]) -> None:
    if result.get("smoke"):
        return
    thin = [f"{r['scenario']}/{r['metric']}" for r in result["rows"] if r["status"] == "measured" and r["repeats"] < 3]
    if thin:
        raise ValueError(
            f"rows with fewer than 3 repeats cannot be reported outside a smoke run: {', '.join(thin)}; "
            "rerun with --repeats 3 or more"
        )


def _pace_text(by_cpu: dict[str, float] | float) -> str:
    if not isinstance(by_cpu, dict):  # the first files with a pace timed it once, unpinned
        by_cpu = {"unpinned": by_cpu}
    return ", ".join(f"{cpu} {_fmt(float(ms))}" for cpu, ms in by_cpu.items())


def _pace_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per scenario: the host's pace per CPU just before and after it (``benchmarks.pace``)."""
    seen: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows:
        pace = row.get("host_pace_ms")
        if pace and row["scenario"] not in seen:
            seen[row["scenario"]] = pace
    return [
        f"- {scenario}: host pace (reference workload, ms per CPU) before: {_pace_text(pace['before'])}; "
        f"after: {_pace_text(pace['after'])}"
        for scenario, pace in seen.items()
    ]


def render_markdown(result: dict[str, Any]) -> str:
    _check_repeats(result)
    host = result["host"]
    lines = []
    if result.get("smoke"):
        lines += [f"> **{SMOKE_LABEL}**", ""]
    lines += [
        f"Host `{host.get('hostname', '?')}`: {host.get('cpu')} ({host.get('cores')} cores, {host.get('ram_gb')} GiB), "
        f"{host.get('os')}, Python {host.get('python')}, torch {host.get('torch') or 'absent'}, "
        f"numpy {host.get('numpy') or 'absent'}, GPU {host.get('gpu') or 'none'}, flashruntime {host.get('flashruntime')}, "
        f"filesystem {host.get('fs')}. Run at {result.get('created_at')}.",
        "",
    ]
    if result.get("host_pace_workload"):
        lines += [
            f"Host pace: each scenario's notes give the median time of a fixed reference workload "
            f"({result['host_pace_workload']}) pinned to each CPU in turn, just before and after it; a larger "
            "figure means a slower CPU.",
            "",
        ]
    for section in SECTIONS:
        rows = [r for r in result["rows"] if r["section"] == section]
        if not rows:
            continue
        lines += [
            f"### {section.capitalize()}",
            "",
            "| scenario | metric | n | median | min | max | comparator (median) | ratio | target | met |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            if row["status"] != "measured":
                lines.append(
                    f"| {row['scenario']} | {row['metric']} | 0 | skipped: {row.get('skip_reason')} | | | | | "
                    f"{_target(row)} | — |"
                )
                continue
            comparator = row.get("comparator")
            comparator_text = f"{comparator['name']} ({_fmt(comparator['median'])})" if comparator else "—"
            lines.append(
                f"| {row['scenario']} | {row['metric']} | {row['repeats']} | {_fmt(row['median'])} {row['unit']} | "
                f"{_fmt(row['min'])} | {_fmt(row['max'])} | {comparator_text} | {_fmt(row.get('ratio'))} | "
                f"{_target(row)} | {_fmt(row.get('met'))} |"
            )
        notes = [f"- {r['scenario']}/{r['metric']}: {n}" for r in rows for n in r.get("notes", [])]
        notes += _pace_notes(rows)
        lines += [""] + (notes + [""] if notes else [])
    return "\n".join(lines).rstrip() + "\n"


def render_document(result: dict[str, Any], title: str = "Benchmarks") -> str:
    """A whole docs page: title, how to reproduce, then the report."""
    return (
        f"# {title}\n\n"
        "Every figure below was measured in one run of `python -m benchmarks run` on the host described, "
        "side by side with the comparator named in its row. `met` is judged only on the reference host "
        "(the 2-core development machine the targets were set on).\n\n" + render_markdown(result)
    )
