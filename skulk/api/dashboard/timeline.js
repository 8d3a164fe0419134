// Timelines on a time axis: the cluster's runner events (one lane per node) and, asked by id,
// one request's events across the nodes it touched (GET /v1/requests/{id}).
import { ApiFailure, call } from "./api.js";
import { clock, h, s, show } from "./dom.js";

const W = 960;
const LANE = 26;
const LEFT = 190;
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];

function colour(kind) {
  let hash = 0;
  for (const ch of kind) hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  return PALETTE[hash % PALETTE.length];
}

function describe(event) {
  const skip = new Set(["at", "node", "node_id", "kind"]);
  const rest = Object.entries(event).filter(([k, v]) => !skip.has(k) && v !== null && v !== "");
  return `${clock(event.at)} ${event.kind}\n${rest.map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join("\n")}`;
}

/** Events (each with `at`, a node and a `kind`) drawn as dots on lanes, one per node. */
export function axis(events, nodeOf, testid) {
  if (!events.length) return h("p", { class: "muted" }, "No events yet.");
  const lanes = [...new Set(events.map(nodeOf))].sort();
  const first = Math.min(...events.map((e) => e.at));
  const last = Math.max(...events.map((e) => e.at));
  const span = Math.max(last - first, 1e-3);
  const x = (at) => LEFT + ((W - LEFT - 20) * (at - first)) / span;
  const height = 30 + LANE * lanes.length;
  const ticks = [];
  for (let i = 0; i <= 4; i++) {
    const at = first + (span * i) / 4;
    ticks.push(s("line", { class: "tick", x1: x(at), x2: x(at), y1: 4, y2: height - 22 }));
    const label = span < 5 ? `+${((at - first) * 1000).toFixed(0)} ms` : clock(at);
    const anchor = i === 4 ? "end" : i === 0 ? "start" : "middle";
    ticks.push(s("text", { class: "small", x: x(at), y: height - 6, "text-anchor": anchor }, label));
  }
  return s(
    "svg",
    { viewBox: `0 0 ${W} ${height}`, class: "timeline", "data-testid": testid },
    ticks,
    lanes.map((lane, i) => s("text", { class: "small", x: 6, y: 20 + LANE * i }, lane)),
    events.map((e) =>
      s("circle", { cx: x(e.at), cy: 16 + LANE * lanes.indexOf(nodeOf(e)), r: 5, fill: colour(e.kind), class: "event", "data-kind": e.kind }, s("title", {}, describe(e))),
    ),
  );
}

function legend(events) {
  const kinds = [...new Set(events.map((e) => e.kind))].sort();
  return h("div", { class: "legend" }, kinds.map((k) => h("span", {}, h("i", { style: `background:${colour(k)}` }), k)));
}

export function renderTimeline(target, snap) {
  const timeline = snap.timeline;
  if (!timeline) {
    show(target, h("p", { class: "muted" }, (snap.errors && snap.errors.timeline) || "Waiting for the cluster timeline…"));
    return;
  }
  const events = timeline.events || [];
  const missing = (timeline.unanswered || []).map((u) => `${u.node} (${u.reason})`);
  show(
    target,
    axis(events, (e) => e.node, "cluster-timeline"),
    legend(events),
    missing.length ? h("p", { class: "muted" }, `Not answering: ${missing.join(", ")}`) : null,
  );
}

export function installRequestTimeline() {
  const form = document.getElementById("request-form");
  const target = document.getElementById("request-timeline");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = document.getElementById("request-id").value.trim();
    if (!id) return;
    try {
      const answer = await call("GET", `/v1/requests/${encodeURIComponent(id)}`);
      const events = answer.events || [];
      show(target, h("p", {}, `Request ${answer.request_id}: ${events.length} events`), axis(events, (e) => e.node_id || e.node, "request-timeline"), legend(events));
    } catch (err) {
      const message = err instanceof ApiFailure && err.status === 404 ? `No request ${id} is known to this cluster (or this node does not trace requests).` : `Failed: ${err.message}`;
      show(target, h("p", { class: "muted" }, message));
    }
  });
}
