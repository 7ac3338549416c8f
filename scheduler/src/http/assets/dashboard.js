// The Resident dashboard: polls /v1/overview once a second and redraws. Every value goes
// into the page as text (never as markup), so names from the cluster cannot inject HTML.
"use strict";

const POLL_MS = 1000;
const liveRates = new Map(); // job id -> [{ t, items }], oldest first

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  seconds = Math.round(seconds);
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(s).padStart(2, "0")}s` : `${s}s`;
}

function bar(fraction, label, kind) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return el("div", { class: `bar ${kind || ""}`, role: "progressbar", "aria-valuenow": pct.toFixed(1) },
    el("span", { style: `width:${pct.toFixed(1)}%` }), el("em", {}, label));
}

function fill(tbodyId, emptyId, rows) {
  const tbody = document.querySelector(`#${tbodyId} tbody`);
  tbody.replaceChildren(...rows);
  document.getElementById(emptyId).hidden = rows.length > 0;
}

// docs/s over the last ten seconds of server time (what is happening now), once at least
// two seconds are covered; else the job's average since it started.
const RATE_WINDOW_MS = 10000;
const RATE_MIN_SPAN_MS = 2000;
function liveRate(job, nowMs) {
  const samples = (liveRates.get(job.job_id) || []).filter((s) => nowMs - s.t <= RATE_WINDOW_MS && s.t < nowMs);
  const items = job.items_done + job.items_running;
  samples.push({ t: nowMs, items });
  liveRates.set(job.job_id, samples);
  const oldest = samples[0];
  const span = nowMs - oldest.t;
  if (job.state !== "running" || span < RATE_MIN_SPAN_MS) return job.items_per_second;
  return Math.max(0, items - oldest.items) / (span / 1000);
}

function jobRow(job, nowMs) {
  const finished = job.succeeded + job.failed + job.cancelled;
  const total = Math.max(job.expected_tasks, job.submitted);
  const rate = liveRate(job, nowMs);
  return el("tr", { "data-job": job.job_id },
    el("td", {}, job.name || job.job_id, el("div", { class: "muted" }, job.job_id)),
    el("td", {}, job.pool),
    el("td", { class: `state-${job.state}` }, job.state),
    el("td", { class: "progress" }, bar(job.progress, `${(job.progress * 100).toFixed(1)}%`)),
    el("td", { class: "num tasks" }, `${finished}/${total}`, job.failed ? el("div", { class: "state-failed" }, `${job.failed} failed`) : null),
    el("td", { class: "num items", title: `${job.items_running} of them inside running tasks` }, job.items_done + job.items_running),
    el("td", { class: "num rate" }, rate.toFixed(1)),
    el("td", { class: "num" }, duration(job.eta_seconds)),
    el("td", { class: "num" }, duration(job.elapsed_seconds)),
    el("td", { class: "num" }, `$${job.cost_usd.toFixed(4)}`, el("div", { class: "muted" }, `${(job.gpu_seconds / 3600).toFixed(3)} GPU-h`)));
}

function nodeCard(node) {
  const gpus = node.gpus.map((gpu) => {
    const used = gpu.total_vram_bytes - gpu.free_vram_bytes;
    const here = node.actors.filter((a) => a.gpu_indices.includes(gpu.index));
    const util = gpu.utilization_ratio === null ? "" : ` · ${(gpu.utilization_ratio * 100).toFixed(0)}% busy`;
    return el("div", { class: "gpu" },
      el("div", {}, `GPU ${gpu.index}: ${gpu.name}${gpu.simulated ? " (simulated)" : ""}${util}`),
      bar(gpu.total_vram_bytes ? used / gpu.total_vram_bytes : 0, `${bytes(used)} / ${bytes(gpu.total_vram_bytes)} VRAM`, "vram"),
      el("div", {}, here.map((a) => el("span", { class: `chip state-${a.state}`, title: a.actor_id },
        `${a.pool} ${a.gpu_fraction < 1 ? a.gpu_fraction.toFixed(2) : ""}`))));
  });
  const unavailable = node.unavailable_gpus.map((gpu) =>
    el("div", { class: "gpu state-failed", title: gpu.reason }, `GPU ${gpu.index}: unavailable (${gpu.reason})`));
  const cpuActors = node.actors.filter((a) => a.gpu_indices.length === 0);
  return el("div", { class: "card node", "data-node": node.node_id },
    el("h3", {}, node.node_id, " ", el("span", { class: `state-${node.state}` }, node.state)),
    el("div", { class: "muted" }, `${node.hostname} · ${node.cpu_cores} cores · ${bytes(node.ram_bytes)} RAM · heard ${duration(node.last_heartbeat_ms_ago / 1000)} ago`),
    gpus.length || unavailable.length ? gpus : el("div", { class: "muted" }, "no GPUs"),
    unavailable,
    cpuActors.length ? el("div", {}, "CPU: ", cpuActors.map((a) => el("span", { class: `chip state-${a.state}`, title: a.actor_id }, a.pool))) : null);
}

// What a pool's actors have held since it was made: GPU-hours, else core-hours.
function held(pool) {
  if (pool.gpu_hours > 0) return `${pool.gpu_hours.toFixed(4)} GPU-h`;
  if (pool.cpu_core_hours > 0) return `${pool.cpu_core_hours.toFixed(4)} core-h`;
  return "–";
}

function poolRow(pool) {
  return el("tr", { "data-pool": pool.name },
    el("td", {}, pool.name, pool.unplaced_reason ? el("div", { class: "state-failed" }, pool.unplaced_reason) : null),
    el("td", {}, pool.kind),
    el("td", { class: "num" }, `${pool.ready_actors}/${pool.replicas}`),
    el("td", { class: "num" }, pool.queued_tasks),
    el("td", { class: "num" }, pool.running_tasks),
    el("td", { class: "num held" }, held(pool)),
    el("td", {}, pool.actors.map((a) => el("span", { class: `chip state-${a.state}`, title: a.error || a.actor_id },
      `${a.state} @ ${a.node_id || "–"}${a.gpu_indices.length ? ":" + a.gpu_indices.join(",") : ""}, ${a.model_loads} loads, ${a.tasks_done} tasks`))));
}

function sweepBlock(job) {
  const board = job.summary.leaderboard || [];
  const columns = board.length ? Object.keys(board[0]) : [];
  return el("div", { class: "card sweep" },
    el("h3", {}, job.name || job.job_id),
    el("div", { class: "muted" }, job.summary.status || ""),
    el("table", {}, el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
      el("tbody", {}, board.map((row) => el("tr", {}, columns.map((c) => el("td", {}, typeof row[c] === "object" ? JSON.stringify(row[c]) : row[c])))))));
}

function draw(view) {
  const nowMs = view.generated_unix_ms;
  const alive = view.nodes.filter((n) => n.state === "alive").length;
  const gpus = view.nodes.reduce((sum, n) => sum + n.gpus.length, 0);
  const running = view.jobs_by_state.running || 0;
  document.getElementById("summary").textContent =
    `${alive} node${alive === 1 ? "" : "s"} alive · ${gpus} GPUs · ${view.pools.length} pools · ${running} running job${running === 1 ? "" : "s"} · ${view.demand_gpus.toFixed(2)} GPUs in demand`;
  fill("jobs", "no-jobs", view.jobs.map((j) => jobRow(j, nowMs)));
  const nodes = view.nodes.map(nodeCard);
  document.getElementById("nodes").replaceChildren(...nodes);
  document.getElementById("no-nodes").hidden = nodes.length > 0;
  fill("pools", "no-pools", view.pools.map(poolRow));
  const sweeps = view.jobs.filter((j) => j.summary && j.summary.leaderboard);
  document.getElementById("sweeps").replaceChildren(...sweeps.map(sweepBlock));
  document.getElementById("sweeps-section").hidden = sweeps.length === 0;
  const events = view.events.map((e) => el("li", {},
    el("time", {}, new Date(e.unix_ms).toLocaleTimeString()), `${e.subject} ${e.name}: ${e.message}`));
  document.getElementById("events").replaceChildren(...events);
  document.getElementById("no-events").hidden = events.length > 0;
}

async function poll() {
  const live = document.getElementById("live");
  const problem = document.getElementById("problem");
  try {
    const response = await fetch("/v1/overview", { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) { location.href = "/login"; return; }
    if (!response.ok) throw new Error(`${response.status}: ${(await response.text()).trim()}`);
    draw(await response.json());
    live.classList.remove("stale");
    live.title = `updated ${new Date().toLocaleTimeString()}`;
    problem.hidden = true;
  } catch (error) {
    live.classList.add("stale");
    problem.textContent = `Cannot reach the scheduler (${error.message}); retrying every second.`;
    problem.hidden = false;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
