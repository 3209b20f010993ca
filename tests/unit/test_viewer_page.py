"""the live run page is one self-contained document (no external assets), its
inline script is valid JS, and the script's logic behaves on real and odd state documents.
The JS checks run in node: pure helpers via require(), the live wiring in a vm context with a
stub DOM and fetch (no browser)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flashruntime.viewer import page
from flashruntime.viewer.page import TOKENS, render

SECTION_IDS = ("header", "kpis", "topology", "charts", "checkpoints", "events", "logs")
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")

T0 = 1767225600.0
HOSTILE = "<script>alert(1)</script>"

SAMPLE: dict[str, Any] = {
    "contract": "viewer_v1",
    "workload": {"command": ["python", "train.py", HOSTILE], "mode": "local", "source": "/home/u/proj"},
    "state": "RUNNING", "started_at": T0, "finished_at": None, "max_restarts": 2, "checkpoint_dir": None,
    "now": T0 + 65.4,
    "attempts": [
        {"attempt_id": "task-000", "job_id": "local", "state": "FAILED", "pid": "4100", "started_at": T0,
         "finished_at": T0 + 5, "output_dir": "/r/local/task-000", "exit_code": 1, "metrics": [],
         "log_tail": ["boom"], "telemetry": [], "ranks": []},
        {"attempt_id": "task-001", "job_id": "local", "state": "RUNNING", "pid": "4242", "started_at": T0 + 6,
         "finished_at": None, "output_dir": "/r/local/task-001", "exit_code": None,
         "metrics": [{"step": 10, "loss": 0.52, "ts": T0 + 10}, {"step": 20, "loss": 0.41, "ts": T0 + 15},
                     {"step": 30, "loss": 0.33, "ts": T0 + 20}],
         "log_tail": ["step 10", HOSTILE, "a & b"],
         "telemetry": [
             {"ts": T0 + 10, "machine": {"hostname": "box", "cpu_count": 16, "load_avg": None, "cpu_percent": None,
                                         "mem_total": 64 * 2**30, "mem_used": 16 * 2**30, "limited": False, "gpus": []},
              "processes": []},
             {"ts": T0 + 12, "machine": {"hostname": "box", "cpu_count": 16, "load_avg": [0.4, 0.3, 0.2],
                                         "cpu_percent": 12.5, "mem_total": 64 * 2**30, "mem_used": 16 * 2**30,
                                         "limited": False,
                                         "gpus": [{"name": "H100", "util_percent": 80.0, "mem_used_mb": 40000,
                                                   "mem_total_mb": 81559},
                                                  {"name": "H100", "util_percent": 90.0, "mem_used_mb": 1000,
                                                   "mem_total_mb": 81559}]},
              "processes": []}],
         "ranks": [{"rank": 0, "local_rank": 0, "pid": 4243, "device": "cuda:0", "backend": "nccl",
                    "world_size": 2, "step": 30, "ts": T0 + 20},
                   {"rank": 1, "local_rank": 1, "pid": 4244, "device": HOSTILE, "backend": "nccl",
                    "world_size": 2, "step": 29, "ts": T0 + 20}]},
    ],
    "events": [
        {"ts": T0, "type": "LAUNCH_STARTED", "message": "task-000 launched (pid 4100)"},
        {"ts": T0 + 5, "type": "FAILURE_CLASSIFIED", "message": HOSTILE},
        {"ts": T0 + 6, "type": "RECOVERY_ACTION_SELECTED", "message": "restart"},
    ],
    "trials": [],
    "checkpoints": [
        {"job_id": "local", "step": 10, "validation": "hash_verified", "parts": 2, "age_s": 80.0, "latest_valid": False},
        {"job_id": "local", "step": 20, "validation": "hash_verified", "parts": 1, "age_s": 12.5, "latest_valid": True},
        {"job_id": "local", "step": 30, "validation": "size_mismatch", "parts": 2, "age_s": 1.0, "latest_valid": False},
    ],
    "monitor": None,
}
SAMPLE["monitor"] = SAMPLE["attempts"][1]["telemetry"][1]
SAMPLE["goodput"] = {"goodput": 0.714, "lost_work_s": 18.6, "recoveries": [{"mttd_s": 0.75, "mttr_s": 4.98}]}
SAMPLE["view"] = {
    "fan_out": False, "derived": False, "metric": None, "mode": None, "best_trial_id": None,
    "loss": {"key": "loss", "x": "step", "points_per_series": 600},
    "tasks": [{"job_id": "local", "index": 0, "params": None, "state": "RUNNING",
               "attempt_ids": ["task-000", "task-001"], "attempts": [0, 1], "restarts": 1, "started_at": T0,
               "finished_at": None, "metric": None, "metrics": None, "best": False, "read_fraction": 1.0,
               "segments": [{"attempt_id": "task-000", "attempt": 0, "points": [[1, 0.9], [5, 0.7]]},
                            {"attempt_id": "task-001", "attempt": 1, "points": [[4, 0.6], [20, 0.41], [30, 0.33]]}]}],
}


def _trial(k: int, params: dict[str, Any], state: str, metric: float | None, restarts: int) -> dict[str, Any]:
    attempt_ids = [f"task-{k:03d}"] + [f"task-{k:03d}-r{r}" for r in range(1, restarts + 1)]
    return {"job_id": f"local-{k:03d}", "index": k, "params": params, "state": state, "attempt_ids": attempt_ids,
            "attempts": [], "restarts": restarts, "started_at": T0 + k, "finished_at": T0 + k + 30 if metric else None,
            "metric": metric, "metrics": {"final_loss": metric} if metric else None, "best": k == 1,
            "read_fraction": 1.0 if k else 0.5,
            "segments": [{"attempt_id": attempt_ids[0], "attempt": k, "points": [[1, 1.0 + k], [10, 0.5 + k]]}]}


# A sweep of three trials, one restarted once, the second the best.
SWEEP: dict[str, Any] = {**SAMPLE, "workload": {**SAMPLE["workload"], "mode": "independent_tasks"}, "view": {
    "fan_out": True, "derived": False, "metric": "final_loss", "mode": "min", "best_trial_id": "local-001",
    "loss": {"key": "loss", "x": "step", "points_per_series": 600},
    "tasks": [_trial(0, {"lr": 0.1, "name": HOSTILE}, "SUCCEEDED", 0.25, 1),
              _trial(1, {"lr": 0.5}, "SUCCEEDED", 0.125, 0),
              _trial(2, {"lr": 1.0, "layers": [2, 4]}, "RUNNING", None, 0)]}}


def _script() -> str:
    html = render()
    start = html.index("<script>") + len("<script>")
    return html[start:html.index("</script>", start)]


def _node(tmp_path: Path, harness: str) -> Any:
    """Run ``harness`` next to the page script (as ./page.js) and parse the JSON it prints."""
    (tmp_path / "page.js").write_text(_script())
    (tmp_path / "harness.js").write_text(harness)
    proc = subprocess.run([NODE, "harness.js"], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---- the document --------------------------------------------------------------------------

def test_document_shape() -> None:
    html = render()
    assert html.startswith("<!doctype html>")
    for section in SECTION_IDS:
        assert f'id="{section}"' in html
    assert '<header id="header">' in html and 'id="detail"' in html
    for needle in ('"/api/state"', "2000", "visibilitychange", 'href="/docs/"', "connection lost, retrying"):
        assert needle in html
    assert "render" in page.__all__


def test_self_contained() -> None:
    html = render()
    lowered = html.lower()
    # the one <link> is an empty inline icon, so the browser does not ask the server for /favicon.ico
    assert lowered.count("<link") == 1 and '<link rel="icon" href="data:,">' in lowered
    for forbidden in ("http://", "https://", "<script src", "@import", "<img", "@font-face"):
        assert forbidden not in lowered
    css = html[html.index("<style>"):html.index("</style>")]
    assert "url(" not in css
    assert lowered.count("<script") == 1


def test_palette_is_shared() -> None:
    html = render()
    for value in TOKENS.values():
        assert value in html
    for state, token in page.STATE_COLOURS.items():
        assert f".st-{state}{{color:var(--{token})}}" in html


def test_render_builds_a_fresh_identical_string() -> None:
    assert render() == render()


@needs_node
def test_inline_script_passes_node_check(tmp_path: Path) -> None:
    path = tmp_path / "page.js"
    path.write_text(_script())
    proc = subprocess.run([NODE, "--check", str(path)], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---- pure helpers and views in node --------------------------------------------------------

HELPERS = r"""
const {H, V} = require("./page.js");
const out = {
  esc: H.esc("<script>"), escQuote: H.esc(`"'&`), escNull: H.esc(null), escZero: H.esc(0),
  dur65: H.fmtDuration(65), dur5: H.fmtDuration(5.9), dur3725: H.fmtDuration(3725), durBad: H.fmtDuration(null),
  ago: H.fmtAgo(12.5), agoLong: H.fmtAgo(125),
  params: [H.fmtParams({lr: 0.1, layers: [2, 4]}), H.fmtParams(null), H.fmtParams({})],
  duration: [H.taskDuration({started_at: 10, finished_at: 40}, 99), H.taskDuration({started_at: 10}, 25),
             H.taskDuration({}, 25)],
  lossChart: H.lossChart({view: {tasks: [{segments: [{attempt_id: "a", points: [[1, 2], [2, 1], null, [3, "x"]]},
                                                     {attempt_id: "b", points: []},
                                                     {attempt_id: "c", points: [[2, 1.5], [4, 0.5]]}]}]}}),
  chartMarks: H.chartSvg([{cls: "ser-0", points: [[1, 2], [2, 1]], dot: false}, {cls: "ser-0", points: [[2, 1.5], [4, 0.5]], dot: true}],
                         {marks: [{x: 2, label: "<r1>"}], data: {breaks: "r1"}}),
  ticks: H.allTicks({attempts: [{telemetry: [{ts: 5}, {ts: 1}]}, {telemetry: [{ts: 3}, {}]}]}).map((t) => t.ts),
  limited: [H.limited([{machine: {limited: true}}]), H.limited([{machine: {limited: true}}, {machine: {limited: false}}]),
            H.limited([])],
  rate: H.stepsPerSec([{step: 0, ts: 100}, {step: 10, ts: 105}, {step: 30, ts: 110}]),
  rateFallback: H.stepsPerSec([{step: 0, ts: 100}, {step: 30, ts: 110}, {step: 30, ts: 112}]),
  rateNone: H.stepsPerSec([{step: 5, ts: 100}]),
  rateNoTs: H.stepsPerSec([{step: 5}, {step: 6}]),
  stepMetrics: H.latestStep({metrics: [{step: 3}, {step: 4}, {loss: 1}], ranks: [{step: 99}]}),
  stepRanks: H.latestStep({metrics: [{loss: 1}], ranks: [{step: 7}, {step: 9}, {}]}),
  stepNone: H.latestStep({}),
  star: H.latestValidIndex([{latest_valid: false}, {latest_valid: true}, {}]),
  noStar: H.latestValidIndex([{latest_valid: "true"}]),
  restarts: [H.restartsUsed([]), H.restartsUsed([{}]), H.restartsUsed([{}, {}, {}])],
  elapsedRunning: H.elapsed({started_at: 100, now: 165.5}),
  elapsedDone: H.elapsed({started_at: 100, finished_at: 130, now: 999}),
  resources: H.resourceSeries([{ts: 1, machine: {cpu_percent: null, mem_used: 1, mem_total: 4}},
                               {ts: 2, machine: {cpu_percent: 50, mem_used: null, mem_total: 4}}, {machine: {}}]),
  gpus: H.gpus({gpus: [{util_percent: 80, mem_used_mb: 10, mem_total_mb: 100}, {util_percent: null, mem_used_mb: 5, mem_total_mb: 100}]}),
  noGpus: H.gpus({gpus: []}),
  stCls: [H.stCls("RUNNING"), H.stCls("<b x=1>"), H.stCls(null)],
  chartEmpty: H.chartSvg([{cls: "loss", points: []}]),
  chartOne: H.chartSvg([{cls: "loss", points: [[5, 1]]}]),
};
const sample = JSON.parse(process.argv[2] || "null") || globalThis.SAMPLE;
out.views = {};
for (const [name, fn] of Object.entries(V)) out.views[name] = fn(sample, name === "logs" ? new Set(["1"]) : "attempt:1");
out.rankDetail = V.detail(sample, "rank:1:1");
out.machineDetail = V.detail(sample, "machine");
out.goneDetail = V.detail(sample, "rank:0:5");
out.limitedCharts = V.charts({attempts: [{telemetry: [{ts: 1, machine: {limited: true, cpu_percent: null, gpus: []}},
                                                     {ts: 3, machine: {limited: true, gpus: [{util_percent: 40}]}}]}]});
out.untimedCharts = V.charts({attempts: [{telemetry: [{ts: 1, machine: {limited: false, cpu_percent: null}}]}]});
const sweep = JSON.parse(process.argv[3] || "null") || globalThis.SWEEP;
out.sweep = {};
for (const [name, fn] of Object.entries(V)) out.sweep[name] = fn(sweep, name === "logs" ? new Set() : "trial:0");
const odd = [{}, {attempts: [null, {}, {metrics: "x", ranks: [null], log_tail: [null, 3]}]}, {monitor: {machine: null}},
             {attempts: "x", events: [null, {}], checkpoints: [null, {}], workload: {command: "a b"}, state: 5},
             {attempts: [{metrics: [{}], telemetry: [{ts: 1, machine: {gpus: [null]}}]}], monitor: {machine: {gpus: [{}]}}},
             {view: {fan_out: true, loss: {key: 3}, tasks: [null, {}, {segments: [null, {points: "x"}], params: "p",
                                                                    attempts: [99, "x"], restarts: "2"}]}}];
out.odd = odd.map((st) => Object.fromEntries(Object.entries(V).map(([name, fn]) => [name, fn(st, name === "logs" ? new Set() : "attempt:0")])));
console.log(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def helpers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if NODE is None:
        pytest.skip("node is not installed")
    harness = HELPERS.replace("globalThis.SAMPLE", json.dumps(SAMPLE)).replace("globalThis.SWEEP", json.dumps(SWEEP))
    return _node(tmp_path_factory.mktemp("helpers"), harness)


def test_escaping(helpers: dict[str, Any]) -> None:
    assert helpers["esc"] == "&lt;script&gt;"
    assert helpers["escQuote"] == "&quot;&#39;&amp;"
    assert (helpers["escNull"], helpers["escZero"]) == ("", "0")
    # State names become class names: stripped to [A-Za-z0-9_] so they cannot break out of the attribute.
    assert helpers["stCls"] == ["state st-RUNNING", "state st-bx1", "state"]


def test_time_formatting(helpers: dict[str, Any]) -> None:
    assert helpers["dur65"] == "1m 05s"
    assert helpers["dur5"] == "5s"
    assert helpers["dur3725"] == "1h 02m 05s"
    assert helpers["durBad"] == "—"
    assert (helpers["ago"], helpers["agoLong"]) == ("12 s ago", "2m 05s ago")
    assert helpers["elapsedRunning"] == pytest.approx(65.5)
    assert helpers["elapsedDone"] == 30


def test_loss_chart_draws_each_attempt_as_its_own_line_and_marks_restarts(helpers: dict[str, Any]) -> None:
    chart = helpers["lossChart"]
    # Bad points are dropped; an attempt without points draws nothing; the next one starts a new line.
    assert [s["points"] for s in chart["series"]] == [[[1, 2], [2, 1]], [[2, 1.5], [4, 0.5]]]
    assert [s["dot"] for s in chart["series"]] == [False, True]  # one dot, at the task's newest point
    assert chart["marks"] == [{"x": 2, "label": "c"}] and chart["reading"] is None
    svg = helpers["chartMarks"]
    assert 'data-x-min="1" data-x-max="4"' in svg and 'data-points="4" data-lines="2"' in svg
    assert 'data-breaks="r1"' in svg and svg.count("<polyline") == 2 and svg.count("<circle") == 1
    assert svg.count('class="brk"') == 1 and "&lt;r1&gt;" in svg


def test_params_durations_and_ticks(helpers: dict[str, Any]) -> None:
    assert helpers["params"] == ["lr=0.1 layers=[2,4]", "—", "—"]
    assert helpers["duration"] == [30, 15, None]
    assert helpers["ticks"] == [1, 3, 5]  # every attempt's ticks, oldest first; a tick without ts is dropped
    assert helpers["limited"] == [True, False, False]


def test_steps_and_rate(helpers: dict[str, Any]) -> None:
    assert helpers["rate"] == 4                # last two timed records: 20 steps / 5 s
    assert helpers["rateFallback"] == 2.5      # last two share a step: first → last, 30 steps / 12 s
    assert helpers["rateNone"] is None and helpers["rateNoTs"] is None
    assert helpers["stepMetrics"] == 4
    assert helpers["stepRanks"] == 9
    assert helpers["stepNone"] is None
    assert helpers["restarts"] == [0, 0, 2]


def test_checkpoint_star_and_resources(helpers: dict[str, Any]) -> None:
    assert helpers["star"] == 1 and helpers["noStar"] == -1
    assert helpers["resources"] == {"cpu": [[2, 50]], "mem": [[1, 25]], "gpu": []}
    assert helpers["gpus"] == {"count": 2, "util": 80, "used": 15, "total": 200}
    assert helpers["noGpus"] is None
    assert helpers["chartEmpty"] == ""
    assert helpers["chartOne"].startswith('<svg class="chart"') and "<circle" in helpers["chartOne"]


def test_views_escape_everything(helpers: dict[str, Any]) -> None:
    views = helpers["views"]
    everything = "".join(views.values()) + helpers["rankDetail"] + helpers["machineDetail"]
    assert "<script" not in everything
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in views["logs"]
    assert "a &amp; b" in views["logs"]
    assert "&lt;script&gt;" in views["header"] and "&lt;script&gt;" in views["events"]
    assert "&lt;script&gt;" in helpers["rankDetail"]


def test_view_contents(helpers: dict[str, Any]) -> None:
    v = helpers["views"]
    assert 'class="badge state st-RUNNING"' in v["header"]
    assert "1 / 2" in v["header"]                                  # restarts used / max
    for text in ("1m 05s", ">30<", "steps/s", ">2<", "step latency", "500 ms", "12.5%", "16.0 / 64.0 GiB (25%)",
                 "GPU ×2", "85% · 41000 / 163118 MB", "verified checkpoints", 'data-goodput="0.714"',
                 "71.4% · lost 18s", "MTTD / MTTR", "0.75 s / 4.98 s"):
        assert text in v["kpis"], text
    assert 'data-node="machine"' in v["topology"] and ">box<" in v["topology"]
    assert 'data-node="attempt:0"' in v["topology"] and 'data-node="rank:1:1"' in v["topology"]
    assert 'data-node="rank:0:0"' not in v["topology"]               # ranks only under the running attempt
    assert "box state st-RUNNING sel" in v["topology"]
    assert "<dt>job_id</dt><dd>local</dd>" in v["detail"] and "<dt>pid</dt><dd>4242</dd>" in v["detail"]
    assert "<dt>backend</dt><dd>nccl</dd>" in helpers["rankDetail"]
    assert "<dt>world_size</dt><dd>2</dd>" in helpers["rankDetail"]
    assert helpers["goneDetail"] == ""
    assert "<code>loss</code> vs step · 2 attempts" in v["charts"] and v["charts"].count("<svg") == 2
    assert 'data-chart="loss"' in v["charts"] and 'data-x-min="1" data-x-max="30"' in v["charts"]
    assert 'data-breaks="task-001"' in v["charts"] and ">task-001</text>" in v["charts"]
    assert "GPU %" in v["charts"] and 'class="ln ln-gpu"' in v["charts"]  # the sample's one tick with GPUs
    assert v["trials"] == ""                                        # no trials section for a single command
    assert v["checkpoints"].count("<li") == 3 and v["checkpoints"].count("★") == 1
    assert v["checkpoints"].count("hash verified") == 2 and v["checkpoints"].count("invalid") == 1
    assert "12 s ago" in v["checkpoints"] and "1 part<" in v["checkpoints"]
    rows = v["events"].split("<tr")[1:]
    assert [('class="hl"' in r) for r in rows] == [True, True, False]  # newest first
    assert "RECOVERY_ACTION_SELECTED" in rows[0]
    assert v["logs"].count("<details") == 2 and '<details data-attempt="1" open>' in v["logs"]


def test_the_resource_chart_says_why_it_is_empty(helpers: dict[str, Any]) -> None:
    limited = helpers["limitedCharts"]
    # Without psutil: the reason and the fix; a GPU reading (nvidia-smi needs no psutil) is still drawn.
    assert "psutil is not installed" in limited and "pip install psutil" in limited
    assert 'data-chart="resources"' in limited and 'class="ln ln-gpu"' in limited and "ln-cpu" not in limited
    assert "no readings yet" in helpers["untimedCharts"] and "psutil" not in helpers["untimedCharts"]


def test_a_sweep_is_drawn_as_trials_not_as_restarts(helpers: dict[str, Any]) -> None:
    v = helpers["sweep"]
    assert "<span class=\"k\">trials</span>3" in v["header"] and "<span class=\"k\">best</span>local-001" in v["header"]
    assert "restarts" not in v["header"]
    assert "trials done" in v["kpis"] and ">2 / 3<" in v["kpis"] and ">restarts<" not in v["kpis"]
    # one row per trial: id, parameters (escaped), state, the sweep's metric, duration, its own restarts
    rows = v["trials"].split("<tr data-trial=")[1:]
    assert [r.split('"')[1] for r in rows] == ["local-000", "local-001", "local-002"]
    assert "lr=0.1 name=&lt;script&gt;alert(1)&lt;/script&gt;" in rows[0] and "<script" not in v["trials"]
    assert ">0.25<" in rows[0] and ">30s<" in rows[0] and ">1 / 2<" in rows[0]
    assert 'class="best"' in rows[1] and "★" in rows[1] and "★" not in rows[0] + rows[2]
    assert "lr=1 layers=[2,4]" in rows[2] and "st-RUNNING" in rows[2] and ">0 / 2<" in rows[2]
    assert "<th>final_loss (min)</th>" in v["trials"]
    # the trials side by side, not chained by arrows
    assert v["topology"].count('data-node="trial:') == 3 and v["topology"].count("→") == 1
    assert "box state st-SUCCEEDED sel" in v["topology"]                   # trial:0 is selected
    assert "<dt>params</dt>" in v["detail"] and "<dt>restarts</dt><dd>1</dd>" in v["detail"]
    # the trials' curves on one chart, one colour each, with a legend and no restart marks
    charts = v["charts"]
    assert 'data-lines="3"' in charts and 'data-tasks="3"' in charts and 'data-breaks=""' in charts
    assert all(f"ln-ser-{k}" in charts for k in range(3)) and 'class="brk"' not in charts
    assert charts.count('<span data-trial="') == 3 and "3 trials" in charts
    assert "reading history 50%" in charts


def test_views_survive_odd_documents(helpers: dict[str, Any]) -> None:
    empty = helpers["odd"][0]
    assert "no metrics yet" in empty["charts"] and "no telemetry yet" in empty["charts"]
    assert "no checkpoints yet" in empty["checkpoints"] and "no events yet" in empty["events"]
    assert "this machine" in empty["topology"]
    assert "GPU" not in empty["kpis"]
    assert "GPU ×1" in helpers["odd"][4]["kpis"] and "— · 0 / 0 MB" in helpers["odd"][4]["kpis"]
    assert 'class="badge state st-5"' in helpers["odd"][3]["header"] and ">a b<" in helpers["odd"][3]["header"]
    odd_sweep = helpers["odd"][5]
    assert odd_sweep["trials"].count("<tr data-trial=") == 2 and "no metrics yet" in odd_sweep["charts"]


# ---- live wiring in a vm with a stub DOM ---------------------------------------------------

LIVE = r"""
const fs = require("fs"), vm = require("vm");
const html = fs.readFileSync("page.html", "utf8");
const sample = JSON.parse(fs.readFileSync("sample.json", "utf8"));
const ids = [...html.matchAll(/ id="([^"]+)"/g)].map((m) => m[1]);
const els = {};
for (const id of ids) {
  const classes = new Set();
  els[id] = {id, innerHTML: "", textContent: "", className: "", hidden: false, listeners: {},
    classList: {add: (c) => classes.add(c), remove: (c) => classes.delete(c), contains: (c) => classes.has(c)},
    addEventListener(type, fn) { this.listeners[type] = fn; }, querySelectorAll: () => []};
}
const docListeners = {};
const document = {visibilityState: "visible", title: "", getElementById: (id) => els[id] || null,
  addEventListener: (type, fn) => { docListeners[type] = fn; }};
let nextTimer = 1;
const intervals = new Map(), cleared = [];
let responses = [], fetched = [];
const fetch = (url, opts) => { fetched.push(url); const r = responses.shift(); return r instanceof Error ? Promise.reject(r) : Promise.resolve(r); };
const ok = (doc) => ({ok: true, status: 200, json: async () => doc});
const ctx = vm.createContext({document, fetch, console,
  setInterval: (fn, ms) => { const id = nextTimer++; intervals.set(id, ms); return id; },
  clearInterval: (id) => { cleared.push(id); intervals.delete(id); },
  setTimeout: () => 0, clearTimeout: () => {}, AbortController});
const settle = () => new Promise((r) => setImmediate(r));
const snap = () => ({status: els.status.textContent, statusCls: els.status.className, stale: els.main.classList.contains("stale"),
  kpis: els["kpis-body"].innerHTML, hdr: els["hdr-body"].innerHTML, logs: els["logs-body"].innerHTML,
  detail: els.detail.innerHTML, detailHidden: els.detail.hidden, title: document.title});
(async () => {
  const out = {};
  responses.push(ok(sample));
  vm.runInContext(fs.readFileSync("page.js", "utf8"), ctx);
  await settle(); await settle();
  out.first = {fetched: [...fetched], intervals: [...intervals.values()], ...snap()};

  const click = (node) => els.topology.listeners.click({target: {closest: (sel) => (sel === "[data-node]" && node ? {dataset: {node}} : null)}});
  click("attempt:1");
  out.clicked = snap();
  els.topology.listeners.click({target: {closest: (sel) => (sel === "[data-close]" ? {} : null)}});
  out.closed = snap();

  document.visibilityState = "hidden"; docListeners.visibilitychange();
  out.hidden = {intervals: intervals.size, cleared: cleared.length, fetched: fetched.length};
  responses.push(new Error("Failed to fetch"));
  document.visibilityState = "visible"; docListeners.visibilitychange();
  await settle(); await settle();
  out.lost = {intervals: [...intervals.values()], fetched: fetched.length, ...snap()};

  responses.push({ok: false, status: 500, json: async () => { throw new SyntaxError("bad json"); }});
  await ctx.refresh(); out.http500 = snap();

  responses.push({ok: false, status: 503, json: async () => ({error: "run.json is torn <b>"})});
  await ctx.refresh(); out.error = snap();

  responses.push(ok(sample));
  await ctx.refresh(); out.recovered = snap();
  console.log(JSON.stringify(out));
})();
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if NODE is None:
        pytest.skip("node is not installed")
    tmp = tmp_path_factory.mktemp("live")
    (tmp / "page.html").write_text(render())
    (tmp / "sample.json").write_text(json.dumps(SAMPLE))
    return _node(tmp, LIVE)


def test_live_polls_and_draws(live: dict[str, Any]) -> None:
    first = live["first"]
    assert first["fetched"] == ["/api/state"] and first["intervals"] == [2000]
    assert first["status"].startswith("updated ") and not first["stale"]
    assert "1m 05s" in first["kpis"] and "st-RUNNING" in first["hdr"]
    assert "&lt;script&gt;" in first["logs"] and "<script" not in first["logs"]
    assert first["detailHidden"] is True and first["title"].startswith("RUNNING")


def test_live_detail_panel(live: dict[str, Any]) -> None:
    assert live["clicked"]["detailHidden"] is False
    assert "<dt>output_dir</dt><dd>/r/local/task-001</dd>" in live["clicked"]["detail"]
    assert live["closed"]["detailHidden"] is True


def test_live_pauses_while_hidden_and_survives_failures(live: dict[str, Any]) -> None:
    assert live["hidden"] == {"intervals": 0, "cleared": 1, "fetched": 1}
    lost = live["lost"]
    assert lost["intervals"] == [2000] and lost["fetched"] == 2      # refreshed at once, timer resumed
    assert lost["status"].startswith("connection lost, retrying") and lost["statusCls"] == "warn"
    assert lost["stale"] and "1m 05s" in lost["kpis"]               # old data kept, greyed
    assert live["http500"]["status"].startswith("connection lost, retrying (HTTP 500")


def test_live_error_document_clears_sections(live: dict[str, Any]) -> None:
    err = live["error"]
    assert err["status"] == "error: run.json is torn <b>" and err["statusCls"] == "bad"  # textContent, not HTML
    assert err["hdr"] == "" and "1m 05s" not in err["kpis"] and "unavailable" in err["kpis"]
    assert not err["stale"]
    rec = live["recovered"]
    assert rec["status"].startswith("updated ") and "1m 05s" in rec["kpis"]


def test_all_template_placeholders_are_filled() -> None:
    assert not re.search(r"__[A-Z_]+__", render())


STRAGGLER_HARNESS = r"""
const {H, V} = require("./page.js");
const rank = (r, compute) => ({rank: r, device: "cpu", backend: "gloo", step: 20, compute_s: compute});
const st = {attempts: [{attempt_id: "task-000", state: "RUNNING",
  ranks: [rank(0, Array(12).fill(0.1)), rank(1, [9, 9, ...Array(10).fill(0.2)]), {rank: 2, step: 20}],
  stragglers: [{rank: 1, host: "node-b", step: 12, ratio: 2.0, ended_step: null},
               {rank: 0, host: "node-a", step: 3, ratio: 1.7, ended_step: 8}]}],
  events: [{ts: 1, type: "STRAGGLER_DETECTED", message: "task-000: rank 1 on node-b is a straggler"}]};
console.log(JSON.stringify({
  compute: [H.rankCompute({compute_s: [0.3, 0.1, 0.2]}), H.rankCompute({compute_s: [0.4, 0.1, 0.2, 0.3]}),
            H.rankCompute({}), H.rankCompute({compute_s: ["x", null]}), H.rankCompute(null)],
  open: [...H.straggling(st.attempts[0]).keys()],
  oddOpen: [...H.straggling({stragglers: [null, {rank: "1"}, {}]}).keys()],
  topology: V.topology(st, ""),
  slowDetail: V.detail(st, "rank:0:1"),
  evenDetail: V.detail(st, "rank:0:2"),
  events: V.events(st),
}));
"""


@needs_node
def test_a_straggling_rank_is_marked_on_its_box_and_in_its_detail(tmp_path: Path) -> None:
    out = _node(tmp_path, STRAGGLER_HARNESS)
    assert out["compute"] == [0.2, pytest.approx(0.25), None, None, None]
    assert out["open"] == [1] and out["oddOpen"] == []  # rank 0's episode ended
    boxes = [box for box in out["topology"].split("<button")[1:] if 'data-node="rank:' in box]
    assert "straggler" not in boxes[0] and "0.100 s compute" in boxes[0]
    assert "box state straggler" in boxes[1] and "rank · straggler" in boxes[1]
    assert "0.200 s compute · 2.0× the others" in boxes[1]  # the median of the last 10: the early 9 s are gone
    assert "compute" not in boxes[2]  # a heartbeat without compute times
    assert "<dt>straggler</dt><dd>2.00× the other ranks&#39; median, since step 12</dd>" in out["slowDetail"]
    assert "<dt>compute per step</dt><dd>0.200 s (median of the last 10)</dd>" in out["slowDetail"]
    assert "<dt>straggler</dt>" not in out["evenDetail"] and "<dt>compute per step</dt><dd>—</dd>" in out["evenDetail"]
    assert '<tr class="hl">' in out["events"] and "STRAGGLER_DETECTED" in out["events"]
