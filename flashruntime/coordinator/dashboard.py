"""The coordinator dashboard (``GET /``): one self-contained page, no external assets,
polling the JSON routes every 2 s. Colours are the viewer's TOKENS.

A job's row opens its detail: each task's curve (from ``/metrics``), a straggler or hang
badge from the job's events, and for the task picked its larger curve and its log's tail;
a running job has a Cancel button. Times read as "12 s ago", the exact time in their tooltip.

The page itself holds no data. When the coordinator has tokens, it asks for one (kept in
the tab's sessionStorage, never in the URL) and sends it as a bearer header on every
call; without one, or with a wrong one, it shows nothing but the request for a token.
Artifact links download through the same header."""

from __future__ import annotations

import json

from flashruntime.viewer.page import SERIES_COLOURS, STATE_COLOURS, TOKENS

__all__ = ["DASHBOARD_HTML"]

_CSS_VARS = "".join(f"--{name}:{value};" for name, value in TOKENS.items())
_STATE_CSS = "".join(f".st-{state}{{color:var(--{token})}}" for state, token in STATE_COLOURS.items())

DASHBOARD_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>FlashRuntime coordinator</title>
<link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
:root{%(vars)s}
body{margin:0;background:var(--bg);color:var(--text);font:14px var(--font)}
header{padding:12px 20px;border-bottom:1px solid var(--border);display:flex;gap:16px;align-items:baseline}
h1{font-size:18px;margin:0} h2{font-size:15px;margin:18px 0 8px;display:flex;gap:12px;align-items:baseline}
main{padding:0 20px 40px} .muted{color:var(--muted)}
table{border-collapse:collapse;width:100%%;background:var(--panel);border:1px solid var(--border)}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--border);font-variant-numeric:tabular-nums;
vertical-align:middle}
th{color:var(--muted);font-weight:600}
tr.pick{cursor:pointer} tr.pick:hover,tr.pick:focus{background:var(--border);outline:none}
tr.sel{box-shadow:inset 3px 0 0 var(--accent)} td.go{color:var(--muted);width:1em;text-align:right}
tr.sel td.go{color:var(--accent)}
code,.mono{font-family:var(--mono);font-size:12px} a{color:var(--accent)}
.on{color:var(--ok)} .off{color:var(--muted)} .cordon{color:var(--warn)} .err{color:var(--bad)}
.badge{display:inline-block;margin:0 4px 0 0;padding:0 6px;border-radius:8px;font-size:12px;
border:1px solid currentColor} .b-straggler{color:var(--warn)} .b-hang{color:var(--bad)}
tr.ev-alert td{color:var(--warn)} tr.ev-bad td{color:var(--bad)}
svg.spark{vertical-align:middle} svg.chart{width:100%%;max-width:760px;height:180px;background:var(--bg);
border:1px solid var(--border)} .axis{fill:var(--muted);font:11px var(--mono)}
#keys button,#cancel,#auth button{font:12px var(--font);padding:3px 8px;background:var(--panel);color:var(--text);
border:1px solid var(--border);cursor:pointer} #keys button.on{border-color:var(--accent);color:var(--accent)}
#cancel{border-color:var(--bad);color:var(--bad)} #cancel:disabled{opacity:.5;cursor:default}
pre#log{background:var(--bg);border:1px solid var(--border);padding:8px;max-height:22em;overflow:auto;
font:12px var(--mono);white-space:pre-wrap;margin:0}
#auth{margin-left:auto;display:flex;gap:6px} #auth input{font:12px var(--mono);padding:3px 6px;width:16em;
background:var(--panel);color:var(--text);border:1px solid var(--border)}
%(states)s
</style></head>
<body><header><h1>FlashRuntime coordinator</h1><span class="muted" id="status">loading…</span>
<form id="auth" autocomplete="off"><input id="token" type="password" placeholder="token (submitter or operator)"
aria-label="token"><button type="submit">use token</button><button type="button" id="forget">forget</button></form>
</header>
<main>
<h2>Nodes</h2><table id="nodes"><thead><tr><th>node</th><th>host</th><th>status</th><th>last heartbeat</th>
<th>accepted</th><th>pools</th><th>cordon</th></tr></thead><tbody></tbody></table>
<h2>Jobs <span class="muted" style="font-weight:400;font-size:12px">select a job to see its tasks</span></h2>
<table id="jobs"><thead><tr><th>job</th><th>name</th><th>state</th><th>workload</th><th>created</th>
<th>tasks</th><th></th></tr></thead><tbody></tbody></table>
<section id="detail" hidden>
<h2>Tasks of <code id="sel"></code> <button type="button" id="cancel" hidden>Cancel job</button></h2>
<table id="tasks"><thead><tr><th>task</th><th>state</th><th>curve</th><th>attempts</th><th>node</th><th>lease ends</th>
<th>failures</th><th>expiries</th><th>released</th><th></th></tr></thead><tbody></tbody></table>
<section id="task" hidden>
<h2>Task <code id="tsel"></code> <span id="keys"></span></h2>
<div id="chart"></div>
<h2>Log tail <span class="muted" style="font-weight:400;font-size:12px">last 20 lines</span></h2>
<pre id="log"></pre>
</section>
<h2>Events</h2><table id="events"><thead><tr><th>time</th><th>type</th><th>message</th></tr></thead><tbody></tbody>
</table>
<h2>Artifacts</h2><table id="artifacts"><thead><tr><th>key</th><th>size</th></tr></thead><tbody></tbody></table>
</section>
</main>
<script>
"use strict";
const COLOURS = %(colours)s;
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
let selected = null, selectedTask = null, chartKey = null, selectedState = null;
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"})[c]);
const cell = (v, cls) => `<td${cls ? ` class="${cls}"` : ""}>${esc(v)}</td>`;
const fill = (id, rows, span) => { document.querySelector(`#${id} tbody`).innerHTML = rows.join("") ||
  `<tr><td colspan="${span || 9}" class="muted">none</td></tr>`; };
// Each segment escaped on its own: '#', '?' and '%%' in a key are part of the key, not of the URL.
const keyPath = (key) => key.split("/").map(encodeURIComponent).join("/");
const fmt = (v) => Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.001) ? v.toExponential(3) : String(+v.toPrecision(4));
function ago(iso) {  // "12 s ago", "in 3 min": the exact time is in the cell's tooltip
  const at = Date.parse(iso);
  if (!iso || Number.isNaN(at)) return iso ? String(iso) : "";
  const s = (Date.now() - at) / 1000, a = Math.abs(s);
  if (a < 3) return "just now";
  const text = a < 90 ? `${Math.round(a)} s` : a < 5400 ? `${Math.round(a / 60)} min`
    : a < 129600 ? `${Math.round(a / 3600)} h` : `${Math.round(a / 86400)} d`;
  return s >= 0 ? `${text} ago` : `in ${text}`;
}
const when = (iso) => iso ? `<td title="${esc(iso)}"><time datetime="${esc(iso)}">${esc(ago(iso))}</time></td>` : "<td></td>";
const TOKEN_KEY = "flashruntime-token";
let token = sessionStorage.getItem(TOKEN_KEY) || "";
const authHeaders = () => token ? {"Authorization": `Bearer ${token}`} : {};
class Refused extends Error { constructor(status, path) { super(`${path}: ${status}`); this.status = status; } }
async function get(path) {
  const r = await fetch(path, {headers: authHeaders()});
  if (r.status === 401 || r.status === 403) throw new Refused(r.status, path);
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}
function say(text, cls) { const el = document.getElementById("status"); el.textContent = text; el.className = cls || "muted"; }
function clearAll() {
  ["nodes", "jobs", "tasks", "events", "artifacts"].forEach((id) => { document.querySelector(`#${id} tbody`).innerHTML = ""; });
  document.getElementById("detail").hidden = true; document.getElementById("task").hidden = true;
}
document.getElementById("auth").onsubmit = (ev) => {
  ev.preventDefault(); token = document.getElementById("token").value.trim();
  document.getElementById("token").value = "";
  if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
  refresh();
};
document.getElementById("forget").onclick = () => { token = ""; sessionStorage.removeItem(TOKEN_KEY); clearAll(); refresh(); };
document.getElementById("cancel").onclick = async () => {
  const job = selected;
  if (!job || !confirm(`Cancel job ${job}? Its running tasks are stopped and no task of it starts again.`)) return;
  document.getElementById("cancel").disabled = true;
  const r = await fetch(`/v1alpha1/jobs/${encodeURIComponent(job)}/cancel`, {method: "POST", headers: authHeaders()});
  if (r.ok) say(`job ${job} cancelled: its running tasks are being stopped`);
  else { say(`cancel refused: ${r.status} ${(await r.text()).slice(0, 200)}`, "err"); document.getElementById("cancel").disabled = false; }
  refresh();
};
async function download(ev) {  // a plain link cannot carry the bearer header
  if (!token) return;
  ev.preventDefault();
  const a = ev.currentTarget;
  const r = await fetch(a.getAttribute("href"), {headers: authHeaders()});
  if (!r.ok) { say(`download refused: ${r.status}`, "err"); return; }
  const url = URL.createObjectURL(await r.blob());
  const save = document.createElement("a"); save.href = url; save.download = a.dataset.name; save.click();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
function clickable(selector, pick) {  // rows that open something: click, Enter or Space
  document.querySelectorAll(selector).forEach((tr) => {
    tr.onclick = () => pick(tr);
    tr.onkeydown = (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(tr); } };
  });
}
function line(points, key, w, h, pad) {  // an SVG path of key over step, scaled to the box
  const pts = points.filter((p) => key in p.values);
  if (!pts.length) return {d: "", lo: 0, hi: 0, first: 0, last: 0};
  const xs = pts.map((p) => p.step), ys = pts.map((p) => p.values[key]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = (v) => pad + (x1 === x0 ? (w - 2 * pad) / 2 : (v - x0) / (x1 - x0) * (w - 2 * pad));
  const sy = (v) => h - pad - (y1 === y0 ? (h - 2 * pad) / 2 : (v - y0) / (y1 - y0) * (h - 2 * pad));
  const d = pts.map((p, i) => `${i ? "L" : "M"}${sx(p.step).toFixed(1)},${sy(p.values[key]).toFixed(1)}`).join("");
  return {d, lo: y0, hi: y1, first: x0, last: x1};
}
function spark(m) {
  const key = m && m.keys.length ? m.keys[0] : null;
  if (!key) return `<td class="muted">no steps yet</td>`;
  const last = m.points[m.points.length - 1].values[key];
  return `<td><svg class="spark" viewBox="0 0 120 26" width="120" height="26" role="img" aria-label="${esc(key)} by step">` +
    `<path d="${line(m.points, key, 120, 26, 2).d}" fill="none" stroke="${COLOURS[0]}" stroke-width="1.5"/></svg> ` +
    `<span class="mono">${esc(key)} ${esc(last === undefined ? "" : fmt(last))}</span></td>`;
}
function chart(m) {
  const keys = m ? m.keys : [];
  if (!keys.includes(chartKey)) chartKey = keys[0] || null;
  document.getElementById("keys").innerHTML = keys.map((k) =>
    `<button type="button" data-key="${esc(k)}" class="${k === chartKey ? "on" : ""}">${esc(k)}</button>`).join("");
  document.querySelectorAll("#keys button").forEach((b) => b.onclick = () => { chartKey = b.dataset.key; chart(m); });
  if (!chartKey) { document.getElementById("chart").innerHTML = `<p class="muted">no step records yet: the task ` +
    `writes them to metrics.jsonl in its output directory (flashruntime.torch's log_metrics does)</p>`; return; }
  const W = 760, H = 180, P = 28, c = line(m.points, chartKey, W, H, P);
  document.getElementById("chart").innerHTML = `<svg class="chart" viewBox="0 0 ${W} ${H}" role="img" ` +
    `aria-label="${esc(chartKey)} by step"><path d="${c.d}" fill="none" stroke="${COLOURS[0]}" stroke-width="2"/>` +
    `<text class="axis" x="4" y="${P - 8}">${esc(fmt(c.hi))}</text><text class="axis" x="4" y="${H - 6}">${esc(fmt(c.lo))}</text>` +
    `<text class="axis" x="${P}" y="${H - 6}" dx="40">step ${c.first}</text>` +
    `<text class="axis" x="${W - P}" y="${H - 6}" text-anchor="end">step ${c.last} · ${m.records} records` +
    `${m.truncated ? " (earlier left out)" : ""}</text></svg>`;
}
function badges(events) {  // task id → badges from the job's events
  const out = {};
  for (const e of events) {
    const id = e.data && e.data.task_id;
    if (!id) continue;
    if (e.type === "STRAGGLER_DETECTED") out[id] = {...(out[id] || {}), straggler:
      `straggler: rank ${e.data.rank} ${Number(e.data.ratio).toFixed(1)}x${e.data.node_id ? " on " + e.data.node_id : ""}`};
    if (e.type === "FAILURE_CLASSIFIED" && e.data.failure_class === "hang") out[id] = {...(out[id] || {}), hang: "hung"};
  }
  return out;
}
function eventClass(e) {
  if (e.type === "STRAGGLER_DETECTED" || e.type === "HANG_DETECTED") return "ev-alert";
  return e.type === "FAILURE_CLASSIFIED" || e.type.endsWith("_FAILED") ? "ev-bad" : "";
}
async function nodeRows() {
  try { return await get("/v1alpha1/nodes"); }
  catch (err) { if (err instanceof Refused && err.status === 403) return null; throw err; }  // operators only
}
async function showTask(metrics) {
  const section = document.getElementById("task");
  if (!selectedTask) { section.hidden = true; return; }
  section.hidden = false;
  document.getElementById("tsel").textContent = selectedTask;
  chart(metrics.find((m) => m.task_id === selectedTask));
  const logs = await get(`/v1alpha1/jobs/${selected}/logs?task=${encodeURIComponent(selectedTask)}&tail=20`);
  const latest = logs.tasks.filter((t) => t.attempt === null).pop();
  document.getElementById("log").textContent = latest && latest.log ? latest.log : "(nothing uploaded yet)";
}
async function refresh() {
  try {
    const [nodes, jobs] = await Promise.all([nodeRows(), get("/v1alpha1/jobs")]);
    if (nodes === null) document.querySelector("#nodes tbody").innerHTML =
      `<tr><td colspan="9" class="muted">the node list needs an operator token</td></tr>`;
    else fill("nodes", nodes.map((n) => `<tr>${cell(n.node_id, "mono")}${cell(n.hostname)}` +
      cell(n.online ? "online" : "offline", n.online ? "on" : "off") + cell(`${n.last_heartbeat_age_s.toFixed(1)} s ago`) +
      cell(n.accepted_tasks) + cell((n.capabilities.pools || []).join(", ")) +
      (n.cordon_reason === null ? "<td></td>" : `<td class="cordon" title="${esc(n.cordoned_until || "")}">cordoned` +
        `${ago(n.cordoned_until).startsWith("in ") ? " for another " + esc(ago(n.cordoned_until).slice(3)) : ""}: ` +
        `${esc(n.cordon_reason)}</td>`) + "</tr>"));
    const counts = {};
    await Promise.all(jobs.map(async (j) => { if (j.backend === "leases" || j.backend === "ray") {
      const ts = await get(`/v1alpha1/jobs/${j.job_id}/tasks`); const c = {};
      ts.forEach((t) => { c[t.state] = (c[t.state] || 0) + 1; }); counts[j.job_id] = c; } }));
    fill("jobs", jobs.map((j) => `<tr class="job pick${j.job_id === selected ? " sel" : ""}" tabindex="0" ` +
      `data-job="${esc(j.job_id)}" title="show the tasks of ${esc(j.job_id)}">` +
      cell(j.job_id, "mono") + cell(j.spec.metadata.name) + cell(j.state, `st-${j.state}`) + cell(j.spec.spec.workload.type) +
      when(j.created_at) + cell(Object.entries(counts[j.job_id] || {}).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ")) +
      `<td class="go" aria-hidden="true">›</td></tr>`));
    clickable("tr.job", (tr) => { if (selected !== tr.dataset.job) selectedTask = null; selected = tr.dataset.job; refresh(); });
    const job = jobs.find((j) => j.job_id === selected);
    selectedState = job ? job.state : null;
    if (selected) {
      const [tasks, events, artifacts, metrics] = await Promise.all([get(`/v1alpha1/jobs/${selected}/tasks`),
        get(`/v1alpha1/jobs/${selected}/events`), get(`/v1alpha1/jobs/${selected}/artifacts`),
        get(`/v1alpha1/jobs/${selected}/metrics?points=120`)]);
      document.getElementById("detail").hidden = false;
      document.getElementById("sel").textContent = selected;
      const cancel = document.getElementById("cancel");
      cancel.hidden = !selectedState || TERMINAL.has(selectedState);
      if (cancel.hidden) cancel.disabled = false;
      const curves = Object.fromEntries(metrics.tasks.map((m) => [m.task_id, m]));
      const marks = badges(events);
      fill("tasks", tasks.map((t) => `<tr class="task pick${t.task_id === selectedTask ? " sel" : ""}" tabindex="0" ` +
        `data-task="${esc(t.task_id)}" title="show the curve and log of ${esc(t.task_id)}">` +
        `<td class="mono">${esc(t.task_id)} ${Object.entries(marks[t.task_id] || {}).map(([kind, text]) =>
          `<span class="badge b-${kind}">${esc(text)}</span>`).join("")}</td>` + cell(t.state, `st-${t.state}`) +
        spark(curves[t.task_id]) + cell(`${t.attempts} / ${t.max_attempts}`) + cell(t.node_id, "mono") + when(t.deadline) +
        cell(t.failures) + cell(`${t.expiries} / ${t.max_expiries}`) + cell(t.released ?? 0) +
        `<td class="go" aria-hidden="true">›</td></tr>`), 10);
      clickable("tr.task", (tr) => { selectedTask = tr.dataset.task; refresh(); });
      fill("events", events.slice(-200).reverse().map((e) => `<tr class="${eventClass(e)}">` + when(e.timestamp) +
        cell(e.type) + cell(e.message) + "</tr>"));
      fill("artifacts", artifacts.map((a) => `<tr><td><a href="/v1alpha1/artifacts/${keyPath(a.key)}" ` +
        `data-name="${esc(a.key.split("/").pop())}">${esc(a.key)}</a></td>` + cell(`${a.size_bytes} B`) + "</tr>"));
      document.querySelectorAll("#artifacts a").forEach((a) => a.onclick = download);
      await showTask(metrics.tasks);
    }
    say(`updated ${new Date().toLocaleTimeString()}`);
  } catch (err) {
    if (err instanceof Refused) {
      clearAll(); selected = null; selectedTask = null;
      say(token ? "this token is refused: enter a submitter or operator token"
        : "this coordinator needs a token: enter a submitter or operator token", "err");
    } else {
      say(`unreachable: ${err.message}`, "err");
    }
  }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
""" % {"vars": _CSS_VARS, "states": _STATE_CSS, "colours": json.dumps(list(SERIES_COLOURS))}
