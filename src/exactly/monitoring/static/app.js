// exactly's checkpoint dashboard: polls the REST API and renders one job at a time.
"use strict";

const REFRESH_MS = 2000;
const state = { jobs: [], job: null, charts: {}, detailsEpoch: null, lastOk: null };
window.exactlyCharts = state.charts; // for tests and the curious: Chart.js instances

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function when(t) {
  if (t === null || t === undefined) return "-";
  const d = new Date(t * 1000);
  return d.toLocaleTimeString([], { hour12: false }) +
    (new Date().toDateString() === d.toDateString() ? "" : " " + d.toLocaleDateString());
}
function ms(v) {
  if (v === null || v === undefined) return "-";
  return v < 10000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(1)} s`;
}
function bytes(v) {
  if (v === null || v === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; let n = v;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}
function num(v) {
  if (v === null || v === undefined) return "-";
  return typeof v === "number" ? v.toLocaleString("en-US", { maximumFractionDigits: 2 }) : String(v);
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error((body.errors || [response.statusText]).join("; "));
  return body;
}

function selectedId() {
  const match = location.hash.match(/job=([^&]+)/);
  return match ? decodeURIComponent(match[1]) : null;
}

function renderJobs() {
  const nav = $("jobs");
  nav.replaceChildren(...state.jobs.map((job) => el("a", {
    href: `#job=${encodeURIComponent(job.id)}`,
    class: job.id === state.job ? "active" : "",
    title: job.checkpoint,
  }, job.name || job.checkpoint.split("/").filter(Boolean).pop())));
}

function renderHead(job, data) {
  $("job-title").textContent = job.name || job.id;
  const status = $("job-status");
  status.textContent = data.status;
  status.className = `status ${data.status}`;
  status.title = data.status_detail || "";
  const detail = $("job-status-detail");
  detail.textContent = data.status_detail || "";
  detail.hidden = !data.status_detail;
  $("job-checkpoint").textContent = data.checkpoint;
}

function secs(v) {
  return v === null || v === undefined ? "-" : `${v.toFixed(1)} s`;
}

// an HA job (exactly run --ha): who leads, since when, the live standbys
function renderSpare(spare) {
  const line = $("job-spare");
  line.hidden = !spare;
  if (!spare) return;
  line.className = `spare ${spare.state}`;
  line.dataset.state = spare.state;
  const facts = [];
  if (spare.pid !== null && spare.pid !== undefined) facts.push(`pid ${spare.pid}`);
  if (spare.since) facts.push(`since ${when(spare.since)}`);
  const said = spare.state === "none" ? "none: a restart starts the next driver from scratch"
    : spare.state + (facts.length ? ` (${facts.join(", ")})` : "");
  line.replaceChildren(el("strong", {}, "spare driver "), el("span", { class: "state" }, said));
}

function renderLeader(leader) {
  const line = $("job-leader");
  line.hidden = !leader;
  if (!leader) return;
  const facts = [];
  if (leader.generation !== null && leader.generation !== undefined) facts.push(`generation ${leader.generation}`);
  if (leader.since !== null && leader.since !== undefined) facts.push(`since ${when(leader.since)}`);
  if (leader.lease === "expired" && leader.age_s !== null && leader.lease_s) {
    facts.push(`lease expired ${secs(leader.age_s - leader.lease_s)} ago`);
  } else if (leader.lease === "released") facts.push("released its lease");
  else if (leader.lease === "ended") {
    const ended = leader.ended || {};
    facts.push(`the job ${ended.state || "ended"} ${when(ended.at)}`);
  } else if (!leader.lease && (leader.unreadable || []).length) facts.push("lease unreadable");
  line.className = `leader ${leader.lease || "unknown"}`;
  line.dataset.host = leader.host || "";
  line.dataset.standbys = (leader.standbys || []).join(",");
  line.replaceChildren(el("strong", {}, "leader "), el("span", { class: "host" }, leader.host || "unknown"),
    facts.length ? ` (${facts.join(", ")})` : "",
    el("span", { class: "muted" }, " · standbys: "),
    el("span", { class: "standbys" }, (leader.standbys || []).join(", ") || "none"));
}

function failoverDuration(f) {
  if (f.outcome === "in_progress") return `in progress (${secs(f.elapsed_s)})`;
  if (f.outcome === "superseded") return "superseded by the next failover";
  if (f.outcome === "ended") return "the job ended first";
  return secs(f.duration_s);
}

function renderFailovers(failovers) {
  const list = failovers || [];
  $("failovers-panel").hidden = !list.length;
  $("failovers").tBodies[0].replaceChildren(...list.slice().reverse().map((f) =>
    el("tr", { class: f.in_progress ? "in_progress" : "", "data-outcome": f.outcome || "" },
      el("td", { class: "nowrap" }, when(f.at)), el("td", { class: "nowrap" }, f.from_host || "-"),
      el("td", { class: "nowrap" }, f.to_host || "-"), el("td", { class: "nowrap" }, when(f.since)),
      el("td", { class: "num nowrap" }, failoverDuration(f)),
      el("td", { class: "cause" }, f.cause || ""))));
}

function renderCards(counts) {
  const order = [["triggered", "triggered"], ["in_progress", "in progress"],
    ["completed", "completed"], ["failed", "failed"], ["restored", "restored"],
    ["restarts", "restarts"], ["savepoints", "savepoints"]];
  $("cards").replaceChildren(...order.map(([key, label]) =>
    el("div", { class: `card ${key}`, "data-count": key },
      el("div", { class: "n" }, num(counts[key] ?? 0)), el("div", { class: "l" }, label))));
}

function renderLatest(latest) {
  const rows = [];
  const c = latest.completed; const f = latest.failed;
  const s = latest.savepoint; const r = latest.restore;
  if (c) rows.push(["completed", c.epoch, when(c.end_at), `${ms(c.duration_ms)} end-to-end, ${bytes(c.full_bytes)} full, ${bytes(c.new_bytes)} new`]);
  if (f) rows.push(["failed", f.epoch, when(f.end_at), `${f.failure || ""}: ${f.cause || ""}`]);
  if (s) rows.push(["savepoint", s.epoch, when(s.at), s.path || ""]);
  if (r) rows.push(["restore", r.epoch, when(r.at), `from ${r.source} ${r.path || ""}` + (r.after_failure ? ` after: ${r.after_failure}` : "")]);
  if (!rows.length) rows.push(["", "", "", "no checkpoint completed yet"]);
  $("latest").tBodies[0].replaceChildren(...rows.map(([what, epoch, at, detail]) =>
    el("tr", { class: what }, el("th", {}, what), el("td", { class: "num" }, String(epoch)),
      el("td", {}, at), el("td", {}, detail))));
}

function renderHistory(history) {
  $("history-count").textContent = `(${history.length} shown, newest first)`;
  $("history").tBodies[0].replaceChildren(...history.map((row) => {
    const tr = el("tr", { class: row.status, "data-epoch": String(row.epoch), "data-status": row.status,
      "data-trigger": row.trigger || "periodic" },
      el("td", { class: "num" }, String(row.epoch)),
      el("td", {}, row.status.replace("_", " ") + (row.restored ? " (after restore)" : "")),
      el("td", {}, when(row.trigger_at) + (row.trigger === "manual" ? " (manual)" : "")),
      el("td", { class: "num" }, ms(row.duration_ms)),
      el("td", { class: "num" }, bytes(row.new_bytes)), el("td", { class: "num" }, bytes(row.full_bytes)),
      el("td", { class: "num" }, num(row.rows_in)), el("td", { class: "num" }, num(row.rows_out)),
      el("td", { class: "cause" }, row.cause || ""));
    tr.addEventListener("click", () => showDetails(row.epoch));
    return tr;
  }));
}

function renderSummary(summary) {
  const lines = [["end-to-end duration", summary.duration_ms, ms],
    ["checkpointed size (new)", summary.new_bytes, bytes],
    ["full checkpoint size", summary.full_bytes, bytes], ["rows processed", summary.rows_in, num]];
  $("summary").tBodies[0].replaceChildren(...lines.map(([label, s, fmt]) =>
    el("tr", {}, el("th", {}, label), el("td", { class: "num" }, fmt(s.min)),
      el("td", { class: "num" }, fmt(s.avg)), el("td", { class: "num" }, fmt(s.max)))));
}

function renderConfig(config) {
  const rows = [];
  for (const [key, value] of Object.entries(config)) {
    if (value && typeof value === "object") {
      for (const [k, v] of Object.entries(value)) rows.push([`${key}.${k}`, v]);
    } else rows.push([key, value]);
  }
  $("config").tBodies[0].replaceChildren(...rows.map(([k, v]) =>
    el("tr", {}, el("th", {}, k), el("td", { class: "mono" }, v === null ? "-" : String(v)))));
}

function renderRestarts(restarts) {
  const rows = restarts.slice().reverse();
  $("restarts").tBodies[0].replaceChildren(...(rows.length ? rows.map((e) =>
    el("tr", { class: e.event === "failure" ? "failed" : "" }, el("td", {}, when(e.at)),
      el("td", {}, e.event), el("td", {}, e.kind || ""), el("td", {}, e.action || ""),
      el("td", {}, (e.cause || (e.recovery_s !== undefined ? `recovered in ${e.recovery_s} s` : ""))
        + (e.repeats > 1 ? ` (same cause ${e.repeats} times in a row)` : ""))))
    : [el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "none"))]));
}

function renderWarnings(warnings) {
  const box = $("warnings");
  box.hidden = !warnings.length;
  box.replaceChildren(...warnings.map((w) => el("div", { class: "warning-line" }, `⚠ ${w}`)));
}

function chart(id, datasets, yTitle) {
  const existing = state.charts[id];
  if (existing) {
    existing.data.datasets.forEach((ds, i) => { ds.data = datasets[i].data; });
    existing.update("none");
    return existing;
  }
  const instance = new Chart($(id), {
    type: "line",
    data: { datasets },
    options: {
      animation: false, parsing: false, normalized: true, responsive: true,
      maintainAspectRatio: false,
      scales: { x: { type: "linear", title: { display: true, text: "epoch" }, ticks: { precision: 0 } },
        y: { beginAtZero: true, title: { display: true, text: yTitle } } },
      plugins: { legend: { display: datasets.length > 1 } },
    },
  });
  state.charts[id] = instance;
  return instance;
}

function renderCharts(history) {
  const done = history.filter((r) => r.status === "completed").sort((a, b) => a.epoch - b.epoch);
  const points = (key) => done.filter((r) => r[key] !== null && r[key] !== undefined)
    .map((r) => ({ x: r.epoch, y: r[key] }));
  chart("chart-duration", [{ label: "end-to-end", data: points("duration_ms"), borderColor: "#2f5fb3", pointRadius: 2 }], "ms");
  chart("chart-size", [
    { label: "full", data: points("full_bytes"), borderColor: "#2f5fb3", pointRadius: 2 },
    { label: "new", data: points("new_bytes"), borderColor: "#b7791f", pointRadius: 2 }], "bytes");
  chart("chart-rows", [
    { label: "rows in", data: points("rows_in"), borderColor: "#1f8a4c", pointRadius: 2 },
    { label: "rows out", data: points("rows_out"), borderColor: "#6b7385", pointRadius: 2 }], "rows");
}

async function showDetails(epoch) {
  state.detailsEpoch = epoch;
  $("details-epoch").textContent = `(epoch ${epoch})`;
  try {
    const data = await getJson(`/jobs/${encodeURIComponent(state.job)}/checkpoints/details/${epoch}`);
    $("details").textContent = JSON.stringify(data, null, 2);
  } catch (err) {
    $("details").textContent = String(err.message || err);
  }
}

async function refresh() {
  try {
    state.jobs = (await getJson("/jobs")).jobs;
    const wanted = selectedId();
    state.job = state.jobs.some((j) => j.id === wanted) ? wanted : (state.jobs[0] || {}).id;
    renderJobs();
    if (!state.job) throw new Error("no job");
    const job = state.jobs.find((j) => j.id === state.job);
    const [data, config] = await Promise.all([
      getJson(`/jobs/${encodeURIComponent(state.job)}/checkpoints`),
      getJson(`/jobs/${encodeURIComponent(state.job)}/checkpoints/config`)]);
    renderHead(job, data);
    renderLeader(data.leader);
    renderSpare(data.spare);
    renderCards(data.counts);
    renderLatest(data.latest);
    renderHistory(data.history);
    renderSummary(data.summary);
    renderConfig(config);
    renderFailovers(data.failovers);
    renderRestarts(data.restarts);
    renderWarnings(data.warnings);
    renderCharts(data.history);
    $("error").hidden = true;
    state.lastOk = new Date();
    document.body.dataset.updated = String(state.lastOk.getTime());
    $("refresh").textContent = `updated ${state.lastOk.toLocaleTimeString([], { hour12: false })}` +
      (data.status === "running" ? " · live" : "");
  } catch (err) {
    const box = $("error");
    box.hidden = false;
    box.textContent = `cannot read the job: ${err.message || err}` +
      (state.lastOk ? ` (showing data from ${state.lastOk.toLocaleTimeString()})` : "");
  }
}

window.addEventListener("hashchange", () => {
  Object.values(state.charts).forEach((c) => c.destroy());
  for (const k of Object.keys(state.charts)) delete state.charts[k];
  refresh();
});
refresh();
setInterval(refresh, REFRESH_MS);
