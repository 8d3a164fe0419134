// Topology: the nodes as a graph (an SVG), links with their RTT as this node sees them, the
// Raft leader marked, and per node its health badge, memory, load and the instances it serves.
import { bytes, h, num, s, show } from "./dom.js";

const W = 960;
const CARD_W = 270;
const CARD_H = 132;
let selected = null; // the node whose health details are open

/** A node's health as the contract gives it; without one (an older node), from its status. */
export function health(row) {
  if (row.health && row.health.level) return row.health;
  if (row.status && row.status !== "up") {
    const reason = { code: "status", level: "error", message: `The cluster has this node ${row.status}.`, remedy: "Check that the node's process is running and reachable." };
    return { level: "error", reasons: [reason] };
  }
  return { level: "ok", reasons: [] };
}

/** The cards' centres on an ellipse, and the height of the drawing that holds them. */
function positions(count) {
  const start = count === 2 ? Math.PI : -Math.PI / 2;
  const raw = Array.from({ length: count }, (_, i) => {
    const angle = start + (2 * Math.PI * i) / count;
    return count === 1 ? [W / 2, 0] : [W / 2 + 330 * Math.cos(angle), 125 * Math.sin(angle)];
  });
  const top = Math.min(...raw.map(([, y]) => y)) - CARD_H / 2 - 8;
  const at = raw.map(([x, y]) => [x, y - top]);
  return { at, height: Math.max(...at.map(([, y]) => y)) + CARD_H / 2 + 8 };
}

/** What a node serves: its gossiped runners, else the ranks the State places on it. */
function served(row, instances) {
  if (Array.isArray(row.serving)) {
    return row.serving.map((r) => `${r.model} r${r.rank} ${r.phase} · ${r.running}/${r.waiting} · ${num(r.tokens_per_s)} tok/s`);
  }
  const lines = [];
  for (const inst of instances) {
    for (const shard of inst.shards) {
      if (shard.node === row.node_id) lines.push(`${inst.model} r${shard.rank} ${shard.runner.phase}`);
    }
  }
  return lines;
}

function reasonsText(level, reasons) {
  if (!reasons.length) return `health: ${level}`;
  return reasons.map((r) => `${r.level}: ${r.message}${r.remedy ? `\nWhat to do: ${r.remedy}` : ""}`).join("\n");
}

function card(row, [x, y], leader, self, instances, onSelect) {
  const id = row.node_id;
  const { level, reasons } = health(row);
  const left = x - CARD_W / 2;
  const top = y - CARD_H / 2;
  const total = row.memory_total_bytes;
  const free = row.memory_available_bytes;
  const usedShare = total ? (total - free) / total : 0;
  const lines = served(row, instances);
  const text = (dy, content, cls) => s("text", { x: left + 10, y: top + dy, class: cls }, content);
  const badge = s(
    "g",
    { class: "badge", "data-testid": `badge-${id}`, "data-level": level, tabindex: 0, role: "button", onclick: () => onSelect(id), onkeydown: (e) => e.key === "Enter" && onSelect(id) },
    s("title", {}, reasonsText(level, reasons)),
    s("rect", { x: left + CARD_W - 62, y: top + 8, width: 52, height: 18, rx: 9 }),
    s("text", { x: left + CARD_W - 36, y: top + 21, "text-anchor": "middle" }, level),
  );
  return s(
    "g",
    { class: `node${id === self ? " self" : ""}`, "data-testid": `node-${id}`, "data-level": level },
    s("rect", { class: "card", x: left, y: top, width: CARD_W, height: CARD_H, rx: 8 }),
    text(21, id, "id"),
    text(38, `${row.hostname || "?"} · ${row.status || "?"}${leader === id ? " · ★ leader" : ""}`, "muted"),
    badge,
    total ? s("rect", { class: "membar", x: left + 10, y: top + 46, width: CARD_W - 20, height: 8, rx: 4 }) : null,
    total ? s("rect", { class: "memused", x: left + 10, y: top + 46, width: (CARD_W - 20) * usedShare, height: 8, rx: 4 }) : null,
    text(70, total ? `mem ${bytes(total - free)} used / ${bytes(free)} free` : "no readings", "small"),
    text(86, row.load_1m !== undefined ? `load ${num(row.load_1m, 2)} on ${row.cpu_count} cpus` : `last seen ${row.age_s === null || row.age_s === undefined ? "never" : `${num(row.age_s)} s ago`}`, "small"),
    ...lines.slice(0, 2).map((line, i) => text(104 + 16 * i, line, "small serving")),
    lines.length > 2 ? text(CARD_H - 2, `+${lines.length - 2} more`, "small muted") : null,
  );
}

function edges(rows, at, links, self) {
  const byPeer = new Map((links || []).filter((l) => l.peer_id).map((l) => [l.peer_id, l]));
  const out = [];
  for (let i = 0; i < rows.length; i++) {
    for (let j = i + 1; j < rows.length; j++) {
      const a = rows[i].node_id;
      const b = rows[j].node_id;
      const mine = a === self ? b : b === self ? a : null;
      const link = mine ? byPeer.get(mine) : null;
      const [x1, y1] = at[i];
      const [x2, y2] = at[j];
      const state = mine ? (link ? link.state : "none") : "unseen";
      out.push(s("line", { class: `link ${state}`, x1, y1, x2, y2, "data-testid": mine ? `link-${mine}` : null }));
      if (link) {
        const label = link.state === "up" && link.rtt_ms !== null ? `${num(link.rtt_ms, 2)} ms` : link.state;
        out.push(s("text", { class: "rtt", x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, "text-anchor": "middle" }, label));
      }
    }
  }
  return out;
}

function detail(target, rows) {
  const row = rows.find((r) => r.node_id === selected);
  if (!row) {
    target.hidden = true;
    return;
  }
  const { level, reasons } = health(row);
  target.hidden = false;
  show(
    target,
    h("strong", {}, `${row.node_id}: ${level}`),
    h("button", { type: "button", class: "close", onclick: () => { selected = null; target.hidden = true; } }, "×"),
    reasons.length
      ? h("ul", {}, reasons.map((r) => h("li", { "data-code": r.code }, h("span", { class: `lvl ${r.level}` }, r.level), ` ${r.message}`, r.remedy ? h("div", { class: "remedy" }, `What to do: ${r.remedy}`) : null)))
      : h("p", {}, "Nothing to report."),
  );
}

export function renderTopology(target, detailTarget, snap) {
  const rows = ((snap.nodes && snap.nodes.nodes) || []).slice().sort((a, b) => a.node_id.localeCompare(b.node_id));
  const instances = (snap.instances && snap.instances.instances) || [];
  const leader = snap.raft ? snap.raft.leader : null;
  const links = snap.links ? snap.links.links : [];
  if (!rows.length) {
    show(target, h("p", { class: "muted" }, snap.errors && snap.errors.nodes ? snap.errors.nodes : "No nodes yet."));
    return;
  }
  const { at, height } = positions(rows.length);
  const select = (id) => {
    selected = selected === id ? null : id;
    detail(detailTarget, rows);
  };
  const svg = s(
    "svg",
    { viewBox: `0 0 ${W} ${height}`, class: "graph", role: "img", "aria-label": "cluster topology" },
    edges(rows, at, links, snap.node_id),
    rows.map((row, i) => card(row, at[i], leader, snap.node_id, instances, select)),
  );
  const caption = h("p", { class: "muted small" }, `Links and RTT as ${snap.node_id} sees them (dotted: between two other nodes). Click a badge for its reasons.`);
  show(target, svg, caption);
  detail(detailTarget, rows);
}
