// topiary's dashboard: polls /api/dashboard once a second and redraws in place.
// Rates come from two successive readings of the broker's cumulative counters.
// Everything from the broker is written with textContent (topics are user data).
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 5000;
const HISTORY = 120; // points in the sparkline (two minutes)
// Keys under which a session's oldest pending age (seconds) may come.
const AGE_KEYS = ["oldest_pending_age_seconds", "oldest_pending_seconds", "oldest_pending_age", "lag_seconds"];

let previous = null; // the last reading
const history = []; // [{in, out}] rates, oldest first

const $ = (id) => document.getElementById(id);

function number(value, digits = 0) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toLocaleString("en", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  return `${number(value, i ? 1 : 0)} ${units[i]}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${number(seconds, 1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
  return `${Math.floor(seconds / 86400)} d ${Math.floor((seconds % 86400) / 3600)} h`;
}

function setText(id, value) {
  const node = $(id);
  if (node.textContent !== value) node.textContent = value;
}

// Replace a table body's rows; each row is a list of [text, className, colSpan (optional)].
function fillRows(tbody, rows, emptyText, columns) {
  const fresh = document.createDocumentFragment();
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = columns;
    td.className = "muted";
    td.textContent = emptyText;
    tr.appendChild(td);
    fresh.appendChild(tr);
  }
  for (const row of rows) {
    const tr = document.createElement("tr");
    if (row.attrs) for (const [k, v] of Object.entries(row.attrs)) tr.setAttribute(k, v);
    if (row.className) tr.className = row.className;
    for (const [text, className, span] of row.cells) {
      const td = document.createElement("td");
      if (className) td.className = className;
      if (span) td.colSpan = span;
      td.textContent = text;
      tr.appendChild(td);
    }
    fresh.appendChild(tr);
  }
  tbody.replaceChildren(fresh);
}

function rates(now, before) {
  if (!before || now.server_id !== before.server_id) return null;
  const dt = now.time - before.time;
  if (dt <= 0) return null;
  const out = {};
  for (const [name, value] of Object.entries(now.counters)) {
    out[name] = Math.max(0, value - (before.counters[name] ?? 0)) / dt;
  }
  return out;
}

function drawRates(r) {
  setText("rate-in", r ? number(r.messages_in, 1) : "–");
  setText("rate-out", r ? number(r.messages_out, 1) : "–");
  setText("rate-unrouted", r ? number(r.messages_unrouted, 1) : "–");
  setText("rate-bytes-in", r ? bytes(r.bytes_in) : "–");
  setText("rate-bytes-out", r ? bytes(r.bytes_out) : "–");
  setText("rate-dropped", r ? number(r.dropped, 1) : "–");
  setText("rate-connections", r ? number(r.connections_total, 1) : "–");
  if (!r) return;
  history.push({ in: r.messages_in, out: r.messages_out });
  while (history.length > HISTORY) history.shift();
  const max = Math.max(1, ...history.map((h) => Math.max(h.in, h.out)));
  const start = HISTORY - history.length; // the newest point on the right edge
  const line = (key) => history
    .map((h, i) => `${((start + i) * 600) / (HISTORY - 1)},${78 - (h[key] / max) * 74}`)
    .join(" ");
  $("spark-in").setAttribute("points", line("in"));
  $("spark-out").setAttribute("points", line("out"));
  setText("spark-max", number(max, 0));
}

function drawEconomy(e) {
  setText("economy-moved-per-wanted", e.moved_per_wanted === null ? "– (nothing wanted yet)" : number(e.moved_per_wanted, 3));
  setText("economy-fanout", e.deliveries_per_message === null ? "–" : number(e.deliveries_per_message, 3));
  setText("economy-counts", `${number(e.published)} / ${number(e.unrouted)} / ${number(e.delivered)}`);
  drawBridges(Array.isArray(e.bridge) ? e.bridge : []);
}

// Each bridge's last report: its flat-topic cost (read per wanted) against ours (moved per wanted).
function drawBridges(reports) {
  setText("economy-bridge", reports.length
    ? `(${reports.length} reporting)`
    : "(no bridge reports to this broker yet)");
  const ratio = (value) => (value === null || value === undefined ? "– (nothing wanted yet)" : number(value, 3));
  fillRows($("bridges").tBodies[0], reports.map((b) => (b.problem
    ? {
      attrs: { "data-bridge": b.bridge },
      className: "malformed",
      cells: [[b.bridge, "topic"], [`malformed report: ${b.problem}`, "problem", 8], [duration(b.age_seconds), "num age"]],
    }
    : {
      attrs: { "data-bridge": b.bridge },
      cells: [[b.bridge_id ?? b.bridge, "topic"], [b.source_topic ?? "–", "topic"],
        [ratio(b.read_per_wanted), "num read-per-wanted"], [ratio(b.moved_per_wanted), "num moved-per-wanted"],
        [number(b.records_in), "num"], [number(b.unwanted_dropped), "num"], [number(b.malformed), "num"],
        [number(b.wanted), "num wanted"], [number(b.published), "num"], [duration(b.age_seconds), "num age"]],
    })), "no bridge reports to this broker yet", 10);
}

function oldestAge(session) {
  for (const key of AGE_KEYS) {
    if (session[key] !== undefined && session[key] !== null) return session[key];
  }
  return null;
}

function drawSessions(s) {
  setText("sessions-count", `(${number(s.count)}, ${number(s.connected)} connected, ${number(s.pending)} pending)`);
  fillRows($("sessions").tBodies[0], s.listed.map((session) => ({
    attrs: { "data-session": session.client_id },
    className: session.pending > 0 && !session.connected ? "lagging" : "",
    cells: [
      [session.group ? `${session.client_id} (group, ${session.members} members)` : session.client_id, "topic"],
      [session.connected ? "yes" : "no", session.connected ? "connected" : "connected off"],
      [number(session.pending), "num pending"],
      [bytes(session.pending_bytes), "num pending-bytes"],
      [duration(oldestAge(session)), "num lag"],
      [`${number(session.last_ack)} / ${number(session.last_seq)}`, "num"],
      [number(session.quota_dropped), "num"],
      [number(session.filters), "num"],
    ],
  })), "no durable sessions", 8);
  setText("sessions-others", s.others.count
    ? `…and ${number(s.others.count)} more with ${number(s.others.pending)} pending (${bytes(s.others.pending_bytes)})`
    : "");
}

function drawHot(hot, r) {
  setText("hot-note", `Sampled: about one routed message in ${hot.sample_every} is counted `
    + `(${number(hot.samples)} so far); counts halve every ${number(hot.half_life_seconds)} s, `
    + "so these are estimates of recent traffic.");
  const inRate = r ? r.messages_in : null;
  const bar = (share) => "█".repeat(Math.max(1, Math.round(Math.min(share, 1) * 10)));
  fillRows($("topics").tBodies[0], hot.topics.map((t) => ({
    cells: [[t.topic, "topic"], [`${bar(t.per_message)} ${number(t.per_message * 100, 1)}%`, "share"],
      [inRate === null ? "–" : number(t.per_message * inRate, 1), "num"]],
  })), "no samples yet", 3);
  fillRows($("filters").tBodies[0], hot.filters.map((f) => ({
    cells: [[f.dialect === "native" ? f.filter : `${f.filter} (${f.dialect})`, "topic"],
      [number(f.per_message, 2), "num"],
      [inRate === null ? "–" : number(f.per_message * inRate, 1), "num"]],
  })), "no samples yet", 3);
}

function drawMesh(mesh, now, before) {
  if (!mesh.active) {
    setText("mesh-summary", "No peers: this broker runs alone.");
    fillRows($("links").tBodies[0], [], "no links", 8);
    fillRows($("origins").tBodies[0], [], "no other brokers known", 6);
    return;
  }
  const links = Object.entries(mesh.links);
  setText("mesh-summary", `${mesh.broker_id}: ${links.length} links, ${number(mesh.reachable)} brokers reachable, `
    + `${number(mesh.remote_filters)} remote filters`);
  const dt = before ? now.time - before.time : 0;
  const beforeLinks = before && before.mesh && before.mesh.links ? before.mesh.links : {};
  const rate = (peer, key, value) => {
    const old = beforeLinks[peer];
    return old && dt > 0 ? number(Math.max(0, value - old[key]) / dt, 1) : "–";
  };
  fillRows($("links").tBodies[0], links.map(([peer, link]) => ({
    attrs: { "data-peer": peer },
    cells: [[peer, "topic"], [link.role, ""], [String(link.address ?? "–"), ""], [duration(link.up_seconds), "num"],
      [rate(peer, "fwd_out", link.fwd_out), "num"], [rate(peer, "fwd_in", link.fwd_in), "num"],
      [number(link.queued), "num"], [number(link.dropped), "num"]],
  })), "no links up", 8);
  fillRows($("origins").tBodies[0], Object.entries(mesh.origins).map(([origin, o]) => ({
    cells: [[origin, "topic"], [o.reachable ? "yes" : "no", o.reachable ? "" : "off"],
      [o.next_hop ?? "–", ""], [o.distance === null ? "–" : String(o.distance), "num"],
      [(o.neighbors || []).join(", "), ""], [number(o.filter_count), "num"]],
  })), "no other brokers known", 6);
}

function draw(now) {
  const before = previous;
  previous = now;
  const r = rates(now, before);
  setText("server-id", now.server_id);
  setText("uptime", duration(now.uptime_seconds));
  setText("connections", number(now.connections));
  setText("subscriptions", number(now.subscriptions));
  setText("queued", number(now.queued));
  drawRates(r);
  drawEconomy(now.economy);
  drawSessions(now.sessions);
  drawHot(now.hot, r);
  drawMesh(now.mesh, now, before);
}

async function poll() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), FETCH_TIMEOUT_MS);
  const status = $("status");
  try {
    const response = await fetch("/api/dashboard", { cache: "no-store", signal: controller.signal });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    draw(await response.json());
    status.dataset.state = "live";
    status.textContent = `live, ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    status.dataset.state = "error";
    status.textContent = `cannot reach the broker (${error.message}); retrying`;
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_MS);
  }
}

poll();
