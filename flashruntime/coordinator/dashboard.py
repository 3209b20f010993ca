"""The coordinator dashboard (``GET /``): one self-contained page, no external assets,
polling the JSON routes every 2 s. Colours are the viewer's TOKENS.

The page itself holds no data. When the coordinator has tokens, it asks for one (kept in
the tab's sessionStorage, never in the URL) and sends it as a bearer header on every
call; without one, or with a wrong one, it shows nothing but the request for a token.
Artifact links download through the same header."""

from __future__ import annotations

from flashruntime.viewer.page import STATE_COLOURS, TOKENS

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
h1{font-size:18px;margin:0} h2{font-size:15px;margin:18px 0 8px}
main{padding:0 20px 40px} .muted{color:var(--muted)}
table{border-collapse:collapse;width:100%%;background:var(--panel);border:1px solid var(--border)}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--border);font-variant-numeric:tabular-nums}
th{color:var(--muted);font-weight:600} tr.sel{outline:1px solid var(--accent)} tr.job{cursor:pointer}
code,.mono{font-family:var(--mono);font-size:12px} a{color:var(--accent)}
.on{color:var(--ok)} .off{color:var(--muted)} .cordon{color:var(--warn)} .err{color:var(--bad)}
#auth{margin-left:auto;display:flex;gap:6px} #auth input{font:12px var(--mono);padding:3px 6px;width:16em;
background:var(--panel);color:var(--text);border:1px solid var(--border)}
#auth button{font:12px var(--font);padding:3px 8px}
%(states)s
</style></head>
<body><header><h1>FlashRuntime coordinator</h1><span class="muted" id="status">loading…</span>
<form id="auth" autocomplete="off"><input id="token" type="password" placeholder="token (submitter or operator)"
aria-label="token"><button type="submit">use token</button><button type="button" id="forget">forget</button></form>
</header>
<main>
<h2>Nodes</h2><table id="nodes"><thead><tr><th>node</th><th>host</th><th>status</th><th>last heartbeat</th>
<th>accepted</th><th>pools</th><th>cordon</th></tr></thead><tbody></tbody></table>
<h2>Jobs</h2><table id="jobs"><thead><tr><th>job</th><th>name</th><th>state</th><th>workload</th><th>created</th>
<th>tasks</th></tr></thead><tbody></tbody></table>
<section id="detail" hidden>
<h2>Tasks of <code id="sel"></code></h2><table id="tasks"><thead><tr><th>task</th><th>state</th><th>attempts</th>
<th>node</th><th>deadline</th><th>failures</th><th>expiries</th><th>released</th></tr></thead><tbody></tbody>
</table>
<h2>Events</h2><table id="events"><thead><tr><th>time</th><th>type</th><th>message</th></tr></thead><tbody></tbody>
</table>
<h2>Artifacts</h2><table id="artifacts"><thead><tr><th>key</th><th>size</th></tr></thead><tbody></tbody></table>
</section>
</main>
<script>
"use strict";
let selected = null;
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"})[c]);
const cell = (v, cls) => `<td${cls ? ` class="${cls}"` : ""}>${esc(v)}</td>`;
const fill = (id, rows) => { document.querySelector(`#${id} tbody`).innerHTML = rows.join("") ||
  `<tr><td colspan="9" class="muted">none</td></tr>`; };
// Each segment escaped on its own: '#', '?' and '%%' in a key are part of the key, not of the URL.
const keyPath = (key) => key.split("/").map(encodeURIComponent).join("/");
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
function clearAll() {
  ["nodes", "jobs", "tasks", "events", "artifacts"].forEach((id) => { document.querySelector(`#${id} tbody`).innerHTML = ""; });
  document.getElementById("detail").hidden = true;
}
document.getElementById("auth").onsubmit = (ev) => {
  ev.preventDefault(); token = document.getElementById("token").value.trim();
  document.getElementById("token").value = "";
  if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
  refresh();
};
document.getElementById("forget").onclick = () => { token = ""; sessionStorage.removeItem(TOKEN_KEY); clearAll(); refresh(); };
async function download(ev) {  // a plain link cannot carry the bearer header
  if (!token) return;
  ev.preventDefault();
  const a = ev.currentTarget;
  const r = await fetch(a.getAttribute("href"), {headers: authHeaders()});
  if (!r.ok) { document.getElementById("status").textContent = `download refused: ${r.status}`; return; }
  const url = URL.createObjectURL(await r.blob());
  const save = document.createElement("a"); save.href = url; save.download = a.dataset.name; save.click();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
async function nodeRows() {
  try { return await get("/v1alpha1/nodes"); }
  catch (err) { if (err instanceof Refused && err.status === 403) return null; throw err; }  // operators only
}
async function refresh() {
  try {
    const [nodes, jobs] = await Promise.all([nodeRows(), get("/v1alpha1/jobs")]);
    if (nodes === null) document.querySelector("#nodes tbody").innerHTML =
      `<tr><td colspan="9" class="muted">the node list needs an operator token</td></tr>`;
    else fill("nodes", nodes.map((n) => `<tr>${cell(n.node_id, "mono")}${cell(n.hostname)}` +
      cell(n.online ? "online" : "offline", n.online ? "on" : "off") + cell(`${n.last_heartbeat_age_s.toFixed(1)} s ago`) +
      cell(n.accepted_tasks) + cell((n.capabilities.pools || []).join(", ")) +
      cell(n.cordon_reason === null ? "" : `cordoned ${n.cordoned_until ? "until " + n.cordoned_until : ""} ${n.cordon_reason}`, "cordon") + "</tr>"));
    const counts = {};
    await Promise.all(jobs.map(async (j) => { if (j.backend === "leases" || j.backend === "ray") {
      const ts = await get(`/v1alpha1/jobs/${j.job_id}/tasks`); const c = {};
      ts.forEach((t) => { c[t.state] = (c[t.state] || 0) + 1; }); counts[j.job_id] = c; } }));
    fill("jobs", jobs.map((j) => `<tr class="job${j.job_id === selected ? " sel" : ""}" data-job="${esc(j.job_id)}">` +
      cell(j.job_id, "mono") + cell(j.spec.metadata.name) + cell(j.state, `st-${j.state}`) + cell(j.spec.spec.workload.type) +
      cell(j.created_at) + cell(Object.entries(counts[j.job_id] || {}).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ")) + "</tr>"));
    document.querySelectorAll("tr.job").forEach((tr) => tr.onclick = () => { selected = tr.dataset.job; refresh(); });
    if (selected) {
      const [tasks, events, artifacts] = await Promise.all([get(`/v1alpha1/jobs/${selected}/tasks`),
        get(`/v1alpha1/jobs/${selected}/events`), get(`/v1alpha1/jobs/${selected}/artifacts`)]);
      document.getElementById("detail").hidden = false;
      document.getElementById("sel").textContent = selected;
      fill("tasks", tasks.map((t) => `<tr>${cell(t.task_id, "mono")}${cell(t.state, `st-${t.state}`)}` +
        cell(`${t.attempts} / ${t.max_attempts}`) + cell(t.node_id, "mono") + cell(t.deadline) + cell(t.failures) +
        cell(`${t.expiries} / ${t.max_expiries}`) + cell(t.released ?? 0) + "</tr>"));
      fill("events", events.slice(-200).reverse().map((e) => `<tr>${cell(e.timestamp, "mono")}${cell(e.type)}${cell(e.message)}</tr>`));
      fill("artifacts", artifacts.map((a) => `<tr><td><a href="/v1alpha1/artifacts/${keyPath(a.key)}" ` +
        `data-name="${esc(a.key.split("/").pop())}">${esc(a.key)}</a></td>` + cell(`${a.size_bytes} B`) + "</tr>"));
      document.querySelectorAll("#artifacts a").forEach((a) => a.onclick = download);
    }
    document.getElementById("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.getElementById("status").className = "muted";
  } catch (err) {
    if (err instanceof Refused) {
      clearAll(); selected = null;
      document.getElementById("status").textContent = token
        ? "this token is refused: enter a submitter or operator token"
        : "this coordinator needs a token: enter a submitter or operator token";
    } else {
      document.getElementById("status").textContent = `unreachable: ${err.message}`;
    }
    document.getElementById("status").className = "err";
  }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
""" % {"vars": _CSS_VARS, "states": _STATE_CSS}
