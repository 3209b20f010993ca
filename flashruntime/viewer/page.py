"""The live run page and the design tokens of flashruntime's pages: one palette
for the run viewer and the coordinator dashboard, so a state reads the same colour everywhere.

``render()`` returns one self-contained HTML document; it must work with the network cut,
so it loads nothing (no fonts, scripts, stylesheets or images) from anywhere."""

from __future__ import annotations

import json

__all__ = ["SERIES_COLOURS", "STATE_COLOURS", "TOKENS", "render"]

TOKENS: dict[str, str] = {
    "bg": "#0f1419",
    "panel": "#171d24",
    "border": "#2a323c",
    "text": "#e6e8eb",
    "muted": "#8a949e",
    "accent": "#4aa3ff",
    "ok": "#3fb950",
    "warn": "#d29922",
    "bad": "#f85149",
    "info": "#a371f7",
    "font": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
    "mono": "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
}

# Job, task and attempt states → token names.
STATE_COLOURS: dict[str, str] = {
    "PENDING": "muted",
    "SUBMITTED": "muted",
    "RUNNING": "accent",
    "LEASED": "accent",
    "RECOVERING": "warn",
    "SUCCEEDED": "ok",
    "COMPLETED": "ok",
    "FAILED": "bad",
    "CANCELLED": "warn",
}

# Curves of a sweep's trials, in trial order; the first is the single command's curve colour.
SERIES_COLOURS: tuple[str, ...] = (TOKENS["accent"], TOKENS["warn"], TOKENS["ok"], TOKENS["info"], TOKENS["bad"],
                                   "#39c5cf", "#db6d28", "#db61a2")

# Log-event types that mark a recovery decision; the feed highlights them.
_HIGHLIGHT_EVENTS = ("FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED")


def _tint(hex_colour: str, alpha: float) -> str:
    """``#rrggbb`` → ``rgba(r,g,b,alpha)``: a translucent background from a palette colour
    without relying on CSS color-mix(), which older browsers lack."""
    value = hex_colour.lstrip("#")
    r, g, b = (int(value[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# The page is written out by hand rather than with str.format/%: CSS braces, JS template
# literals and percentages would all need escaping. Placeholders are replaced in render().
# A raw string keeps JS escapes such as "\n" intact.
_TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flashruntime run</title>
<link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
:root{__CSS_VARS__}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--text);font:14px/1.4 var(--font);font-variant-numeric:tabular-nums}
header{position:sticky;top:0;z-index:1;display:flex;flex-wrap:wrap;gap:8px 16px;align-items:center;padding:10px 20px;
  background:var(--panel);border-bottom:1px solid var(--border)}
h1{font-size:16px;margin:0;font-weight:600}
h2{font-size:12px;margin:0 0 8px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.05em}
.hdr-body{display:flex;flex-wrap:wrap;gap:6px 16px;align-items:center;flex:1;min-width:0}
.cmd{max-width:60ch;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
main{padding:14px 20px 40px;display:grid;gap:14px}
section{background:var(--panel);border:1px solid var(--border);border-radius:6px;padding:10px 14px;min-width:0}
.stale section{opacity:.5}
a{color:var(--accent)}
code,.mono,pre{font-family:var(--mono);font-size:12px}
.muted{color:var(--muted)} .warn{color:var(--warn)} .bad{color:var(--bad)}
.k{color:var(--muted);font-size:12px;margin-right:4px}
.state{color:var(--muted)}
__STATE_CSS__
.badge{display:inline-block;padding:1px 8px;border:1px solid currentColor;border-radius:10px;font-size:12px;font-weight:600}
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:8px}
.kpi{border:1px solid var(--border);border-radius:4px;padding:6px 10px;min-width:0}
.kpi .v{font-size:17px;margin-top:2px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.flow{display:flex;flex-wrap:wrap;align-items:flex-start;gap:8px}
.arrow{color:var(--muted);padding-top:16px}
.col{display:flex;flex-direction:column;gap:6px}
.ranks{display:flex;flex-direction:column;gap:4px;margin-left:12px;padding-left:10px;border-left:1px dashed var(--border)}
.box{display:flex;flex-direction:column;align-items:flex-start;gap:1px;min-width:130px;padding:6px 10px;background:var(--bg);
  border:1px solid var(--border);border-left:4px solid currentColor;border-radius:4px;font:inherit;text-align:left;cursor:pointer}
.box.machine{color:var(--info)}
.box .bk{font-size:11px;color:var(--muted)} .box .bt{color:var(--text);font-weight:600} .box .bs{font-size:12px}
.box.sel,.box:focus-visible{outline:2px solid var(--accent);outline-offset:1px}
#detail{margin-top:10px;border-top:1px solid var(--border);padding-top:8px}
.detail-head{display:flex;justify-content:space-between;align-items:center;margin-bottom:6px}
.close{background:none;border:1px solid var(--border);border-radius:4px;color:var(--muted);cursor:pointer;font:inherit}
.kvlist{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}
.kvlist dt{color:var(--muted)} .kvlist dd{margin:0;font-family:var(--mono);font-size:12px;word-break:break-all}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:12px}
figure{margin:0;min-width:0} figcaption{font-size:12px;color:var(--muted);margin-bottom:4px}
svg.chart{width:100%;height:auto;display:block;background:var(--bg);border:1px solid var(--border);border-radius:4px}
svg text{fill:var(--muted);font:10px var(--mono)}
.grid{stroke:var(--border);stroke-width:1}
.ln{fill:none;stroke-width:1.5}
.ln-cpu{stroke:var(--accent)} .ln-mem{stroke:var(--info)} .ln-gpu{stroke:var(--ok)}
.dot-cpu{fill:var(--accent)} .dot-mem{fill:var(--info)} .dot-gpu{fill:var(--ok)}
__SERIES_CSS__
.brk{stroke:var(--muted);stroke-width:1;stroke-dasharray:4 3}
.sw{display:inline-block;width:12px;height:3px;vertical-align:middle;margin:0 4px 0 10px}
.sw-cpu{background:var(--accent)} .sw-mem{background:var(--info)} .sw-gpu{background:var(--ok)}
.legend{display:flex;flex-wrap:wrap;gap:2px 12px;margin-top:4px;font-size:12px}
.legend .sw{margin-left:0}
.trialcol{display:flex;flex-direction:column;gap:6px;padding-right:6px}
td.params{font-family:var(--mono);font-size:12px;word-break:break-all}
th{text-align:left;font-weight:600;color:var(--muted);font-size:12px;padding:3px 8px;border-bottom:1px solid var(--border)}
tr.best td{background:__OK_BG__}
.timeline{list-style:none;margin:0;padding:0 0 0 16px;border-left:2px solid var(--border)}
.timeline li{position:relative;display:flex;flex-wrap:wrap;gap:4px 12px;align-items:baseline;padding:4px 0}
.timeline li::before{content:"";position:absolute;left:-22px;top:10px;width:10px;height:10px;border-radius:50%;background:var(--border)}
.timeline li.latest::before{background:var(--ok)}
.star{color:var(--warn);min-width:1em}
.tag{padding:0 6px;border-radius:8px;font-size:11px;border:1px solid currentColor}
.tag.ok{color:var(--ok)} .tag.bad{color:var(--bad)}
table{border-collapse:collapse;width:100%}
td{padding:3px 8px;border-bottom:1px solid var(--border);vertical-align:top}
td.t{white-space:nowrap;color:var(--muted)} td.ty{white-space:nowrap}
tr.hl td{background:__WARN_BG__} tr.hl td:first-child{box-shadow:inset 3px 0 var(--warn)}
details{border:1px solid var(--border);border-radius:4px;margin-bottom:6px}
summary{cursor:pointer;padding:4px 8px}
pre{margin:0;padding:8px;max-height:320px;overflow:auto;background:var(--bg);white-space:pre-wrap;word-break:break-all}
</style></head>
<body>
<header id="header"><h1>flashruntime run</h1><div id="hdr-body" class="hdr-body"></div>
<span id="status" class="muted">loading…</span><a href="/docs/">docs</a></header>
<main id="main">
<section id="kpis"><h2>Overview</h2><div id="kpis-body"></div></section>
<section id="topology"><h2>Topology</h2><div id="topology-body"></div><div id="detail" hidden></div></section>
<section id="trials" hidden><h2>Trials</h2><div id="trials-body"></div></section>
<section id="charts"><h2>Charts</h2><div id="charts-body"></div></section>
<section id="checkpoints"><h2>Checkpoints</h2><div id="checkpoints-body"></div></section>
<section id="events"><h2>Events</h2><div id="events-body"></div></section>
<section id="logs"><h2>Logs</h2><div id="logs-body"></div></section>
</main>
<script>
"use strict";
const STATE_URL = "/api/state";
const POLL_MS = 2000;
// A hung request would otherwise block every later poll (one request in flight at a time).
const FETCH_TIMEOUT_MS = 10000;
// The feed keeps the DOM small on long runs; the server already bounds the other lists.
const EVENTS_SHOWN = 200;
const HIGHLIGHT = new Set(__HIGHLIGHT_JSON__);
const SERIES_COUNT = __SERIES_COUNT__;
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const BODIES = ["kpis-body", "topology-body", "trials-body", "charts-body", "checkpoints-body", "events-body", "logs-body"];
const ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"};

// Pure helpers: no DOM access, so tests can exercise them in node. Any field of the state
// document may be missing, null or of the wrong type; every helper copes with that.
const H = {
  esc: (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ESC[c]),
  num: (v) => typeof v === "number" && Number.isFinite(v),
  obj: (v) => (v !== null && typeof v === "object" && !Array.isArray(v) ? v : {}),
  arr: (v) => (Array.isArray(v) ? v : []),
  list: (v) => H.arr(v).filter((x) => x !== null && typeof x === "object" && !Array.isArray(x)),
  pad2: (n) => String(n).padStart(2, "0"),
  // Known states are coloured by .st-<STATE>; an unknown one matches no rule and stays muted via .state.
  stCls(s) {
    const k = String(s ?? "").replace(/[^A-Za-z0-9_]/g, "");
    return k ? `state st-${k}` : "state";
  },
  fmtDuration(s) {
    if (!H.num(s) || s < 0) return "—";
    const t = Math.floor(s), h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60), sec = t % 60;
    if (h) return `${h}h ${H.pad2(m)}m ${H.pad2(sec)}s`;
    if (m) return `${m}m ${H.pad2(sec)}s`;
    return `${sec}s`;
  },
  fmtAgo(s) {
    if (!H.num(s)) return "—";
    return s < 60 ? `${Math.max(0, Math.floor(s))} s ago` : `${H.fmtDuration(s)} ago`;
  },
  fmtClock(ts) {
    if (!H.num(ts)) return "—";
    const d = new Date(ts * 1000);
    return `${H.pad2(d.getHours())}:${H.pad2(d.getMinutes())}:${H.pad2(d.getSeconds())}`;
  },
  fmtStamp(ts) {
    if (!H.num(ts)) return "—";
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${H.pad2(d.getMonth() + 1)}-${H.pad2(d.getDate())} ${H.fmtClock(ts)}`;
  },
  fmtNum(v) {
    if (!H.num(v)) return "—";
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  },
  fmtGiB: (bytes) => (bytes / 1073741824).toFixed(1),
  fmtValue(v) {
    if (v === null || v === undefined) return "—";
    return typeof v === "object" ? JSON.stringify(v) : String(v);
  },
  command(workload) {
    const c = H.obj(workload).command;
    if (Array.isArray(c)) return c.map((x) => String(x ?? "")).join(" ");
    return c === null || c === undefined ? "" : String(c);
  },
  restartsUsed: (attempts) => Math.max(0, H.list(attempts).length - 1),
  latestAttempt(st) {
    const a = H.list(H.obj(st).attempts);
    return a.length ? a[a.length - 1] : {};
  },
  // The attempt whose ranks the flow map shows: the running one, else the newest.
  focusIndex(attempts) {
    const a = H.list(attempts);
    for (let i = a.length - 1; i >= 0; i--) if (a[i].state === "RUNNING") return i;
    return a.length - 1;
  },
  // Seconds since start, on the server's clock (st.now) so a skewed browser clock cannot distort it.
  elapsed(st) {
    const s = H.obj(st);
    if (!H.num(s.started_at)) return null;
    const end = H.num(s.finished_at) ? s.finished_at : H.num(s.now) ? s.now : Date.now() / 1000;
    return Math.max(0, end - s.started_at);
  },
  latestStep(attempt) {
    const a = H.obj(attempt), recs = H.list(a.metrics);
    for (let i = recs.length - 1; i >= 0; i--) if (Number.isInteger(recs[i].step)) return recs[i].step;
    let best = null;
    for (const r of H.list(a.ranks)) if (H.num(r.step) && (best === null || r.step > best)) best = r.step;
    return best;
  },
  // Last two timed records first; if they share a step or a timestamp (e.g. train and eval
  // logged at one step) fall back to the whole span. null when no positive rate exists.
  stepsPerSec(records) {
    const p = H.list(records).filter((r) => H.num(r.step) && H.num(r.ts));
    if (p.length < 2) return null;
    const rate = (a, b) => {
      const dt = b.ts - a.ts, ds = b.step - a.step;
      return dt > 0 && ds > 0 ? ds / dt : null;
    };
    return rate(p[p.length - 2], p[p.length - 1]) ?? rate(p[0], p[p.length - 1]);
  },
  // The page's view of the run (collect()'s "view"): tasks, their curves, the sweep's metric.
  view: (st) => H.obj(H.obj(st).view),
  tasks: (st) => H.list(H.view(st).tasks),
  fanOut: (st) => H.view(st).fan_out === true,
  point: (p) => Array.isArray(p) && p.length >= 2 && H.num(p[0]) && H.num(p[1]),
  fmtParams(params) {
    const entries = Object.entries(H.obj(params));
    if (!entries.length) return "—";
    return entries.map(([k, v]) => `${k}=${v !== null && typeof v === "object" ? JSON.stringify(v) : String(v)}`).join(" ");
  },
  // Seconds a task ran: to its end, or to now (the server's clock) while it runs.
  taskDuration(task, now) {
    const t = H.obj(task);
    if (!H.num(t.started_at)) return null;
    const end = H.num(t.finished_at) ? t.finished_at : H.num(now) ? now : null;
    return end === null ? null : Math.max(0, end - t.started_at);
  },
  trialsDone: (tasks) => H.list(tasks).filter((t) => TERMINAL.has(t.state)).length,
  // The loss chart: one line per attempt (a restart starts a new line, never joined to the
  // one before), coloured per task; restarts of a single task are marked where they start.
  lossChart(st) {
    const tasks = H.tasks(st), fan = H.fanOut(st), series = [], marks = [];
    tasks.forEach((t, k) => {
      const segs = H.list(t.segments).map((g) => ({id: g.attempt_id, points: H.arr(g.points).filter(H.point)}))
        .filter((g) => g.points.length);
      segs.forEach((g, j) => {
        series.push({cls: `ser-${k % SERIES_COUNT}`, points: g.points, dot: j === segs.length - 1});
        if (!fan && j > 0) marks.push({x: g.points[0][0], label: String(g.id ?? "")});
      });
    });
    const reading = tasks.map((t) => t.read_fraction).filter((f) => H.num(f) && f < 1);
    return {series, marks, reading: reading.length ? Math.min(...reading) : null};
  },
  // Every attempt's ticks, oldest first: the machine's resources over the whole run.
  allTicks(st) {
    const ticks = H.list(H.obj(st).attempts).flatMap((a) => H.list(a.telemetry)).filter((t) => H.num(t.ts));
    return ticks.sort((a, b) => a.ts - b.ts);
  },
  // Ticks taken without psutil carry no CPU or memory reading, only that they are limited.
  limited: (ticks) => H.list(ticks).length > 0 && H.list(ticks).every((t) => H.obj(t.machine).limited === true),
  memory(machine) {
    const m = H.obj(machine);
    if (!H.num(m.mem_used) || !H.num(m.mem_total) || m.mem_total <= 0) return null;
    return {used: m.mem_used, total: m.mem_total, pct: (100 * m.mem_used) / m.mem_total};
  },
  gpus(machine) {
    const g = H.list(H.obj(machine).gpus);
    if (!g.length) return null;
    const utils = g.map((x) => x.util_percent).filter(H.num);
    const sum = (k) => g.map((x) => x[k]).filter(H.num).reduce((a, b) => a + b, 0);
    return {count: g.length, util: utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null,
            used: sum("mem_used_mb"), total: sum("mem_total_mb")};
  },
  resourceSeries(ticks) {
    const cpu = [], mem = [], gpu = [];
    for (const t of H.list(ticks)) {
      if (!H.num(t.ts)) continue;
      const m = H.obj(t.machine), mm = H.memory(m), g = H.gpus(m);
      if (H.num(m.cpu_percent)) cpu.push([t.ts, m.cpu_percent]);
      if (mm) mem.push([t.ts, mm.pct]);
      if (g && g.util !== null) gpu.push([t.ts, g.util]);
    }
    return {cpu, mem, gpu};
  },
  latestValidIndex(checkpoints) {
    const c = H.list(checkpoints);
    for (let i = c.length - 1; i >= 0; i--) if (c[i].latest_valid === true) return i;
    return -1;
  },
  verifiedCount: (checkpoints) => H.list(checkpoints).filter((c) => c.validation === "hash_verified").length,
  // The clicked node of the flow map → {title, fields}; null when it no longer exists.
  detailNode(st, sel) {
    const s = H.obj(st), parts = String(sel ?? "").split(":"), atts = H.list(s.attempts);
    if (parts[0] === "machine") {
      const m = H.obj(H.obj(s.monitor).machine);
      return {title: `machine ${m.hostname || "this machine"}`, fields: Object.entries(m)};
    }
    if (parts[0] === "trial") {
      const t = H.tasks(s)[Number(parts[1])];
      return t ? {title: `trial ${t.job_id ?? parts[1]}`, fields: [
        ["trial_id", t.job_id], ["state", t.state], ["params", t.params], ["metric", t.metric],
        ["metrics", t.metrics], ["attempts", H.arr(t.attempt_ids).join(" ")], ["restarts", t.restarts],
        ["started", H.fmtStamp(t.started_at)], ["finished", H.fmtStamp(t.finished_at)]]} : null;
    }
    const a = atts[Number(parts[1])];
    if (!a) return null;
    if (parts[0] === "attempt") {
      return {title: `attempt ${a.attempt_id ?? parts[1]}`, fields: [
        ["attempt_id", a.attempt_id], ["state", a.state], ["job_id", a.job_id], ["pid", a.pid],
        ["exit_code", a.exit_code], ["started", H.fmtStamp(a.started_at)], ["finished", H.fmtStamp(a.finished_at)],
        ["output_dir", a.output_dir]]};
    }
    const r = parts[0] === "rank" ? H.list(a.ranks)[Number(parts[2])] : null;
    return r ? {title: `rank ${r.rank ?? parts[2]} of ${a.attempt_id ?? "attempt"}`, fields: Object.entries(r)} : null;
  },
  // Inline SVG line chart; series = [{cls, points: [[x, y], ...], dot}], marks = [{x, label}] drawn as
  // dashed verticals. The drawn ranges are data attributes. "" when there is nothing to draw.
  chartSvg(series, opts = {}) {
    const W = 600, HT = 180, L = 58, R = 12, T = 10, B = 22;
    const marks = H.list(opts.marks).filter((m) => H.num(m.x));
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, count = 0;
    for (const s of series) for (const [x, y] of s.points) {
      count += 1;
      x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
    if (!count) return "";
    const data = {"x-min": x0, "x-max": x1, "y-min": y0, "y-max": y1, "points": count,
                  "lines": series.filter((s) => s.points.length).length, ...H.obj(opts.data)};
    for (const m of marks) { x0 = Math.min(x0, m.x); x1 = Math.max(x1, m.x); }
    if (H.num(opts.yMin)) y0 = Math.min(y0, opts.yMin);
    if (H.num(opts.yMax)) y1 = Math.max(y1, opts.yMax);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = (x) => (L + ((x - x0) / (x1 - x0)) * (W - L - R)).toFixed(1);
    const sy = (y) => (T + (1 - (y - y0) / (y1 - y0)) * (HT - T - B)).toFixed(1);
    const xf = opts.xFmt || H.fmtNum, yf = opts.yFmt || H.fmtNum;
    const attrs = Object.entries(data).map(([k, v]) => ` data-${H.esc(k)}="${H.esc(v)}"`).join("");
    let out = `<svg class="chart" viewBox="0 0 ${W} ${HT}" role="img" aria-label="${H.esc(opts.label || "chart")}"${attrs}>`;
    for (const y of [y0, (y0 + y1) / 2, y1]) {
      out += `<line class="grid" x1="${L}" x2="${W - R}" y1="${sy(y)}" y2="${sy(y)}"/>` +
        `<text x="${L - 6}" y="${sy(y)}" text-anchor="end" dominant-baseline="middle">${H.esc(yf(y))}</text>`;
    }
    out += `<text x="${L}" y="${HT - 6}">${H.esc(xf(x0))}</text>` +
      `<text x="${W - R}" y="${HT - 6}" text-anchor="end">${H.esc(xf(x1))}</text>`;
    for (const m of marks) {
      const x = sx(m.x);
      out += `<line class="brk" x1="${x}" x2="${x}" y1="${T}" y2="${HT - B}"/>` +
        `<text class="brk-l" x="${(Number(x) + 3).toFixed(1)}" y="${T + 8}">${H.esc(m.label)}</text>`;
    }
    for (const s of series) {
      if (!s.points.length) continue;
      const cls = H.esc(s.cls), last = s.points[s.points.length - 1];
      out += `<polyline class="ln ln-${cls}" points="${s.points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" ")}"/>`;
      if (s.dot !== false) out += `<circle class="dot-${cls}" cx="${sx(last[0])}" cy="${sy(last[1])}" r="2.5"/>`;
    }
    return out + "</svg>";
  },
};

// Views: state document → HTML string. Every value from the document passes through H.esc.
const V = {
  header(st) {
    const s = H.obj(st), w = H.obj(s.workload), atts = H.list(s.attempts), e = H.esc, v = H.view(s);
    // A sweep's trials are not restarts of one another: it counts trials, and restarts per trial.
    const runs = H.fanOut(s)
      ? `<span><span class="k">trials</span>${H.tasks(s).length}</span>` +
        (v.best_trial_id ? `<span><span class="k">best</span>${e(v.best_trial_id)}</span>` : "")
      : `<span><span class="k">restarts</span>${H.restartsUsed(atts)} / ${e(s.max_restarts ?? "—")}</span>`;
    return `<span class="badge ${H.stCls(s.state)}">${e(s.state ?? "—")}</span>` +
      `<code class="cmd" title="${e(w.source ?? "")}">${e(H.command(w) || "—")}</code>` +
      `<span><span class="k">mode</span>${e(w.mode ?? "—")}</span>` + runs +
      `<span><span class="k">attempts</span>${atts.length}</span>`;
  },
  kpis(st) {
    const s = H.obj(st), e = H.esc, a = H.latestAttempt(s), m = H.obj(H.obj(s.monitor).machine);
    const rate = H.stepsPerSec(a.metrics), mem = H.memory(m), gpu = H.gpus(m);
    const tiles = [
      ["state", `<span class="${H.stCls(s.state)}">${e(s.state ?? "—")}</span>`],
      ["elapsed", e(H.fmtDuration(H.elapsed(s)))],
      ["step", e(H.fmtNum(H.latestStep(a)))],
      ["steps/s", e(rate ? H.fmtNum(rate) : "—")],
      ["step latency", e(rate ? `${H.fmtNum(1000 / rate)} ms` : "—")],
      ["CPU", e(H.num(m.cpu_percent) ? `${m.cpu_percent.toFixed(1)}%` : "—")],
      ["memory", e(mem ? `${H.fmtGiB(mem.used)} / ${H.fmtGiB(mem.total)} GiB (${Math.round(mem.pct)}%)` : "—")],
    ];
    if (gpu) {
      tiles.push([`GPU ×${gpu.count}`, e(`${gpu.util === null ? "—" : `${gpu.util.toFixed(0)}%`} · ` +
        `${Math.round(gpu.used)} / ${Math.round(gpu.total)} MB`)]);
    }
    if (H.fanOut(s)) {
      const tasks = H.tasks(s);
      tiles.push(["trials done", e(`${H.trialsDone(tasks)} / ${tasks.length}`)]);
    } else {
      tiles.push(["restarts", e(`${H.restartsUsed(s.attempts)} / ${s.max_restarts ?? "—"}`)]);
    }
    tiles.push(["verified checkpoints", e(H.verifiedCount(s.checkpoints))]);
    const g = H.obj(s.goodput);
    const lost = H.num(g.lost_work_s) ? ` · lost ${H.fmtDuration(g.lost_work_s)}` : "";
    tiles.push(["goodput", `<span data-goodput="${H.num(g.goodput) ? g.goodput : ""}">` +
      e(H.num(g.goodput) ? `${(100 * g.goodput).toFixed(1)}%${lost}` : "—") + "</span>"]);
    const r = H.list(g.recoveries), last = H.obj(r[r.length - 1]);
    if (r.length) {
      tiles.push(["MTTD / MTTR", e(`${H.num(last.mttd_s) ? last.mttd_s.toFixed(2) + " s" : "—"} / ` +
        `${H.num(last.mttr_s) ? last.mttr_s.toFixed(2) + " s" : "—"}`)]);
    }
    return `<div class="kpis">${tiles.map(([k, v]) => `<div class="kpi"><div class="k">${e(k)}</div>` +
      `<div class="v">${v}</div></div>`).join("")}</div>`;
  },
  topology(st, sel) {
    const s = H.obj(st), e = H.esc, atts = H.list(s.attempts), fi = H.focusIndex(atts);
    const m = H.obj(H.obj(s.monitor).machine);
    const box = (key, cls, kind, title, sub) => `<button type="button" class="box ${cls}${sel === key ? " sel" : ""}" ` +
      `data-node="${e(key)}"><span class="bk">${e(kind)}</span><span class="bt">${e(title)}</span>` +
      `<span class="bs">${e(sub)}</span></button>`;
    const arrow = `<span class="arrow">→</span>`;
    const rankBoxes = (a, i) => {
      const ranks = H.list(a.ranks);
      if (!ranks.length) return `<div class="ranks muted">no ranks reported</div>`;
      return `<div class="ranks">${ranks.map((r, j) => box(`rank:${i}:${j}`, "state", "rank", `rank ${r.rank ?? j}`,
        `${r.device ?? "?"} · step ${H.fmtNum(r.step)}`)).join("")}</div>`;
    };
    const attemptBox = (a, i) => box(`attempt:${i}`, H.stCls(a.state), "attempt", a.attempt_id ?? `#${i}`, a.state ?? "—") +
      (i === fi ? rankBoxes(a, i) : "");
    const machine = box("machine", "machine", "machine", m.hostname || "this machine",
      H.num(m.cpu_count) ? `${m.cpu_count} CPUs` : "");
    if (H.fanOut(s)) {  // side by side, each trial over its own attempts: trials are not a retry chain
      const cols = H.tasks(s).map((t, k) => `<div class="trialcol">` +
        box(`trial:${k}`, H.stCls(t.state), "trial", t.job_id ?? `#${k}`, H.fmtParams(t.params)) +
        H.arr(t.attempts).filter((i) => Number.isInteger(i) && atts[i]).map((i) => attemptBox(atts[i], i)).join("") +
        `</div>`);
      return `<div class="flow">${machine}${arrow}` +
        (cols.length ? cols.join("") : `<span class="muted arrow">no trials yet</span>`) + `</div>`;
    }
    const cols = atts.map((a, i) => `<div class="col">${attemptBox(a, i)}</div>`);
    return `<div class="flow">${machine}${arrow}` +
      (cols.length ? cols.join(arrow) : `<span class="muted arrow">no attempts yet</span>`) + `</div>`;
  },
  detail(st, sel) {
    const n = sel ? H.detailNode(st, sel) : null, e = H.esc;
    if (!n) return "";
    return `<div class="detail-head"><strong>${e(n.title)}</strong>` +
      `<button type="button" class="close" data-close="1" aria-label="close">×</button></div>` +
      `<dl class="kvlist">${n.fields.map(([k, v]) => `<dt>${e(k)}</dt><dd>${e(H.fmtValue(v))}</dd>`).join("")}</dl>`;
  },
  // One row per trial of a sweep; "" for a single command (the section stays hidden).
  trials(st) {
    const s = H.obj(st), e = H.esc, v = H.view(s);
    if (!H.fanOut(s)) return "";
    const tasks = H.tasks(s);
    if (!tasks.length) return `<p class="muted">no trials yet</p>`;
    const metricHead = v.metric ? `${v.metric}${v.mode ? ` (${v.mode})` : ""}` : "metrics";
    const metricCell = (t) => {
      if (v.metric) return H.fmtNum(t.metric);
      const shown = Object.entries(H.obj(t.metrics)).filter(([, x]) => H.num(x)).slice(0, 3);
      return shown.length ? shown.map(([k, x]) => `${k}=${H.fmtNum(x)}`).join(" ") : "—";
    };
    const rows = tasks.map((t, k) => `<tr data-trial="${e(t.job_id ?? "")}"${t.best === true ? ` class="best"` : ""}>` +
      `<td class="star"${t.best === true ? ` title="best"` : ""}>${t.best === true ? "★" : ""}</td>` +
      `<td class="mono"><span class="sw sw-ser-${k % SERIES_COUNT}"></span>${e(t.job_id ?? `#${k}`)}</td>` +
      `<td class="params">${e(H.fmtParams(t.params))}</td><td class="${H.stCls(t.state)}">${e(t.state ?? "—")}</td>` +
      `<td class="mono">${e(metricCell(t))}</td><td>${e(H.fmtDuration(H.taskDuration(t, s.now)))}</td>` +
      `<td>${e(`${H.num(t.restarts) ? t.restarts : 0} / ${s.max_restarts ?? "—"}`)}</td></tr>`);
    return `<table><thead><tr><th></th><th>trial</th><th>parameters</th><th>state</th><th>${e(metricHead)}</th>` +
      `<th>duration</th><th>restarts</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
  },
  charts(st) {
    const s = H.obj(st), e = H.esc, v = H.view(s), loss = H.obj(v.loss), fan = H.fanOut(s), tasks = H.tasks(s);
    const key = typeof loss.key === "string" ? loss.key : null, xl = loss.x === "record" ? "record" : "step";
    const lc = H.lossChart(s);
    let lossFig = `<figcaption>loss curve</figcaption><p class="muted">no metrics yet</p>`;
    if (key && lc.series.length) {
      const attempts = H.list(s.attempts).length;
      const note = (fan ? ` · ${tasks.length} trials` : attempts > 1 ? ` · ${attempts} attempts` : "") +
        (lc.reading !== null ? ` · reading history ${Math.floor(lc.reading * 100)}%` : "");
      const legend = fan ? `<div class="legend">${tasks.map((t, k) => `<span data-trial="${e(t.job_id ?? "")}">` +
        `<span class="sw sw-ser-${k % SERIES_COUNT}"></span>${e(t.job_id ?? `#${k}`)} ` +
        `<span class="muted">${e(H.fmtParams(t.params))}</span></span>`).join("")}</div>` : "";
      lossFig = `<figcaption>loss curve · <code>${e(key)}</code> vs ${xl}${e(note)}</figcaption>` +
        H.chartSvg(lc.series, {label: `${key} vs ${xl}`, marks: lc.marks,
          data: {chart: "loss", key, breaks: lc.marks.map((m) => m.label).join(" "), tasks: tasks.length}}) + legend;
    }
    const ticks = H.allTicks(s), rs = H.resourceSeries(ticks), limited = H.limited(ticks);
    const resSvg = H.chartSvg([{cls: "cpu", points: rs.cpu}, {cls: "mem", points: rs.mem}, {cls: "gpu", points: rs.gpu}],
      {yMin: 0, yMax: 100, xFmt: H.fmtClock, yFmt: (x) => `${Math.round(x)}%`, label: "resources in percent over time",
       data: {chart: "resources", ticks: ticks.length}});
    // Without psutil the sampler records only that it could not measure: say so, not "no telemetry".
    const why = limited ? `<p class="muted" data-resources="limited">CPU and memory not measured: psutil is not ` +
      `installed where the run ran (<code>pip install psutil</code>)</p>` : "";
    const empty = ticks.length ? (limited ? "" : `<p class="muted">no readings yet</p>`) : `<p class="muted">no telemetry yet</p>`;
    const res = `<figcaption>resources<span class="sw sw-cpu"></span>CPU %<span class="sw sw-mem"></span>memory %` +
      `${rs.gpu.length ? `<span class="sw sw-gpu"></span>GPU %` : ""}</figcaption>${resSvg || empty}${why}`;
    return `<div class="charts"><figure>${lossFig}</figure><figure>${res}</figure></div>`;
  },
  checkpoints(st) {
    const s = H.obj(st), e = H.esc, cps = H.list(s.checkpoints);
    if (!cps.length) return `<p class="muted">no checkpoints yet</p>`;
    const star = H.latestValidIndex(cps);
    return `<ol class="timeline">${cps.map((c, i) => {
      const ok = c.validation === "hash_verified", parts = H.num(c.parts) ? c.parts : null;
      return `<li${i === star ? ` class="latest"` : ""}><span class="star"${i === star ? ` title="latest valid"` : ""}>` +
        `${i === star ? "★" : ""}</span><span class="mono">step ${e(c.step ?? "—")}</span>` +
        `<span class="tag ${ok ? "ok" : "bad"}">${ok ? "hash verified" : "invalid"}</span>` +
        `<span>${parts === null ? "—" : e(parts)} part${parts === 1 ? "" : "s"}</span>` +
        `<span class="muted">${e(H.fmtAgo(c.age_s))}</span><span class="muted mono">${e(c.job_id ?? "")}</span></li>`;
    }).join("")}</ol>`;
  },
  events(st) {
    const e = H.esc, all = H.list(H.obj(st).events);
    if (!all.length) return `<p class="muted">no events yet</p>`;
    const rows = all.slice(-EVENTS_SHOWN).reverse().map((ev) => `<tr${HIGHLIGHT.has(ev.type) ? ` class="hl"` : ""}>` +
      `<td class="t">${e(H.fmtClock(ev.ts))}</td><td class="ty mono">${e(ev.type ?? "")}</td><td>${e(ev.message ?? "")}</td></tr>`);
    const more = all.length > EVENTS_SHOWN ? `<p class="muted">newest ${EVENTS_SHOWN} of ${all.length}</p>` : "";
    return `<table><tbody>${rows.join("")}</tbody></table>${more}`;
  },
  // open: Set of attempt indices (as strings) whose <details> is expanded.
  logs(st, open) {
    const e = H.esc, atts = H.list(H.obj(st).attempts), fan = H.fanOut(st);
    if (!atts.length) return `<p class="muted">no attempts yet</p>`;
    return atts.map((a, i) => {
      const lines = H.arr(a.log_tail).map((l) => String(l ?? ""));
      const job = fan && a.job_id ? `${a.job_id} / ` : "";
      return `<details data-attempt="${i}"${open.has(String(i)) ? " open" : ""}><summary>` +
        `<span class="mono">${e(job)}${e(a.attempt_id ?? `#${i}`)}</span> <span class="${H.stCls(a.state)}">${e(a.state ?? "—")}</span>` +
        ` <span class="muted">${lines.length} lines</span></summary>` +
        `<pre>${lines.length ? e(lines.join("\n")) : `<span class="muted">no output yet</span>`}</pre></details>`;
    }).join("");
  },
};

// Live wiring: the only part that touches the DOM.
const App = {last: null, sel: null, timer: null, busy: false, html: {}, open: new Set(), seen: new Set()};
const $ = (id) => document.getElementById(id);

// Assigning innerHTML only on change keeps scroll positions, focus and text selection across polls.
function put(id, html) {
  if (App.html[id] === html) return false;
  App.html[id] = html;
  $(id).innerHTML = html;
  return true;
}

function setStatus(text, cls) {
  const el = $("status");
  el.textContent = text;
  el.className = cls;
}

function drawTopology(st) {
  if (App.sel && !H.detailNode(st, App.sel)) App.sel = null;
  put("topology-body", V.topology(st, App.sel));
  const html = V.detail(st, App.sel);
  put("detail", html);
  $("detail").hidden = html === "";
}

function drawLogs(st) {
  // Carry the user's expand/collapse choices over the re-render; a newly seen focus attempt opens.
  const body = $("logs-body");
  for (const d of body.querySelectorAll("details")) {
    if (d.open) App.open.add(d.dataset.attempt); else App.open.delete(d.dataset.attempt);
  }
  const atts = H.list(st.attempts), fi = String(H.focusIndex(atts));
  atts.forEach((_, i) => {
    if (!App.seen.has(String(i)) && String(i) === fi) App.open.add(fi);
    App.seen.add(String(i));
  });
  if (put("logs-body", V.logs(st, App.open))) {
    for (const pre of body.querySelectorAll("pre")) pre.scrollTop = pre.scrollHeight;
  }
}

function draw(st) {
  App.last = st;
  put("hdr-body", V.header(st));
  put("kpis-body", V.kpis(st));
  drawTopology(st);
  const trials = V.trials(st);
  put("trials-body", trials);
  $("trials").hidden = trials === "";
  put("charts-body", V.charts(st));
  put("checkpoints-body", V.checkpoints(st));
  put("events-body", V.events(st));
  drawLogs(st);
  document.title = `${st.state ?? "?"} · ${H.command(st.workload) || "flashruntime run"}`;
}

// run.json missing or torn: say so, and show nothing from an earlier poll as if it were current.
function showError(message) {
  App.last = null;
  put("hdr-body", "");
  for (const id of BODIES) put(id, `<p class="muted">unavailable</p>`);
  $("trials").hidden = true;
  put("detail", "");
  $("detail").hidden = true;
  $("main").classList.remove("stale");
  setStatus(`error: ${message}`, "bad");
  document.title = "error · flashruntime run";
}

async function refresh() {
  if (App.busy) return;
  App.busy = true;
  const ctl = typeof AbortController === "function" ? new AbortController() : null;
  const timeout = ctl ? setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS) : null;
  let doc = null;
  try {
    const r = await fetch(STATE_URL, {cache: "no-store", signal: ctl ? ctl.signal : undefined});
    try { doc = await r.json(); } catch (_) { doc = null; }
    const isObj = doc !== null && typeof doc === "object" && !Array.isArray(doc);
    if (!(isObj && doc.error != null) && (!r.ok || !isObj)) throw new Error(`HTTP ${r.status}`);
  } catch (err) {
    setStatus(`connection lost, retrying (${err && err.message ? err.message : err})`, "warn");
    $("main").classList.add("stale");
    doc = null;
  } finally {
    if (timeout !== null) clearTimeout(timeout);
    App.busy = false;
  }
  if (doc === null) return;
  try {
    if (doc.error != null) { showError(String(doc.error)); return; }
    draw(doc);
    $("main").classList.remove("stale");
    setStatus(`updated ${H.fmtClock(Date.now() / 1000)}`, "muted");
  } catch (err) {
    // A page bug must not look like a network fault, nor stop the polling.
    setStatus(`render error: ${err && err.message ? err.message : err}`, "bad");
    if (typeof console !== "undefined") console.error(err);
  }
}

function start() {
  if (App.timer === null) App.timer = setInterval(refresh, POLL_MS);
  refresh();
}

function stop() {
  if (App.timer !== null) clearInterval(App.timer);
  App.timer = null;
}

function boot() {
  $("topology").addEventListener("click", (ev) => {
    const t = ev.target && typeof ev.target.closest === "function" ? ev.target : null;
    if (!t) return;
    if (t.closest("[data-close]")) App.sel = null;
    else {
      const b = t.closest("[data-node]");
      if (!b) return;
      App.sel = App.sel === b.dataset.node ? null : b.dataset.node;
    }
    if (App.last) drawTopology(App.last);
  });
  // Hidden tabs do not poll; becoming visible refreshes at once, then resumes the timer.
  document.addEventListener("visibilitychange", () => (document.visibilityState === "hidden" ? stop() : start()));
  if (document.visibilityState !== "hidden") start();
}

if (typeof module !== "undefined" && module.exports) module.exports = {H, V};
if (typeof document !== "undefined") boot();
</script></body></html>
"""


def render() -> str:
    """The live run page: one self-contained HTML document (inline CSS and JS, no external
    assets) that polls ``/api/state`` every 2 s while the tab is visible."""
    css_vars = "".join(f"--{name}:{value};" for name, value in TOKENS.items())
    series_css = "".join(
        f".ln-ser-{k}{{stroke:{colour}}} .dot-ser-{k}{{fill:{colour}}} .sw-ser-{k}{{background:{colour}}}"
        for k, colour in enumerate(SERIES_COLOURS))
    state_css = "".join(f".st-{state}{{color:var(--{token})}}" for state, token in STATE_COLOURS.items())
    return (_TEMPLATE
            .replace("__CSS_VARS__", css_vars)
            .replace("__STATE_CSS__", state_css)
            .replace("__SERIES_CSS__", series_css)
            .replace("__SERIES_COUNT__", str(len(SERIES_COLOURS)))
            .replace("__WARN_BG__", _tint(TOKENS["warn"], 0.12))
            .replace("__OK_BG__", _tint(TOKENS["ok"], 0.10))
            .replace("__HIGHLIGHT_JSON__", json.dumps(list(_HIGHLIGHT_EVENTS))))
