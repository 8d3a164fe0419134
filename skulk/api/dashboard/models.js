// The cluster's models: its downloads (GET /v1/downloads in the feed: per node the file in
// flight, bytes, rate and ETA; a failed download with its reason) and every node's store
// (GET /v1/store in the feed: sizes, last use, holders). Remove (press twice) deletes a model
// from the store of the node serving the page; a refusal (model_in_use) is shown as given.
import { call } from "./api.js";
import { bytes, clock, duration, h, progress, rate, show } from "./dom.js";
import { failureView } from "./pull.js";

let confirming = null; // the manifest hash whose Remove was pressed once

function table(head, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), h("tbody", {}, rows));
}

function unavailable(target, snap, part, fallback) {
  const error = snap.errors && snap.errors[part];
  show(target, h("p", { class: "muted" }, error || fallback));
}

export function renderDownloads(target, snap) {
  const part = snap.downloads;
  if (!part) return unavailable(target, snap, "downloads", "Downloads are not known yet.");
  const rows = [];
  const moving = new Set();
  const transfers = [...(part.transfers || [])].sort((a, b) => `${a.node} ${a.model}`.localeCompare(`${b.node} ${b.model}`));
  for (const t of transfers) {
    moving.add(`${t.node} ${t.model}`);
    rows.push(
      h(
        "tr",
        { "data-testid": `download-${t.node}-${t.model}` },
        h("td", {}, h("code", {}, t.node)),
        h("td", {}, t.model),
        h("td", {}, t.source === "hub" ? "the Hub" : "peers"),
        h("td", {}, t.file ? [h("code", {}, t.file), " ", progress(t.file_done, t.file_total)] : "–"),
        h("td", {}, progress(t.bytes_done, t.bytes_total)),
        h("td", { class: "nowrap" }, rate(t.rate_bps)),
        h("td", { class: "nowrap" }, duration(t.eta_s)),
      ),
    );
  }
  for (const d of part.downloads || []) {
    if (d.status !== "failed" && moving.has(`${d.node} ${d.model}`)) continue;
    const failed = d.status === "failed";
    rows.push(
      h(
        "tr",
        { "data-testid": `download-${failed ? "failed-" : ""}${d.node}-${d.model}`, class: failed ? "failed" : "" },
        h("td", {}, h("code", {}, d.node)),
        h("td", {}, d.model),
        h("td", {}, "the Hub"),
        h("td", { colspan: 2 }, failed
          ? [h("span", { class: "phase failed" }, "failed"), " ", h("code", {}, d.reason || "?"), d.detail ? `: ${d.detail}` : ""]
          : [h("span", { class: "phase" }, "starting"), ` ${bytes(d.total_bytes)}`]),
        h("td", { colspan: 2 }, d.changed_at ? `since ${clock(d.changed_at)}` : ""),
      ),
    );
  }
  if (!rows.length) {
    show(target, h("p", { class: "muted" }, "No download in progress."));
    return;
  }
  show(target, table(["node", "model", "from", "file", "model bytes", "rate", "ETA"], rows));
}

/** Each node's store: this node's own answer where it has one (fresh), the others' readings. */
function stores(part) {
  const list = (part.nodes || []).map((n) => ({ ...n }));
  if (part.store) {
    const mine = { node: part.node, ...part.store };
    const at = list.findIndex((n) => n.node === part.node);
    if (at >= 0) list[at] = mine;
    else list.push(mine);
  }
  return list.sort((a, b) => a.node.localeCompare(b.node));
}

function usage(s) {
  const budget = s.budget_bytes === null || s.budget_bytes === undefined ? "no budget" : `budget ${bytes(s.budget_bytes)}`;
  return `${bytes(s.used_bytes)} used · ${budget} · ${bytes(s.available_bytes)} free`;
}

function removeButton(node, m, rerender) {
  const armed = confirming === m.sha256;
  const name = (m.models && m.models[0]) || (m.names && m.names[0]) || m.sha256.slice(0, 12);
  return h(
    "button",
    {
      type: "button",
      class: armed ? "danger" : "",
      "data-testid": `store-remove-${node}-${m.sha256}`,
      onclick: async () => {
        if (!armed) {
          confirming = m.sha256;
          rerender();
          return;
        }
        confirming = null;
        const result = document.getElementById("store-result");
        try {
          const answer = await call("DELETE", `/v1/store/${encodeURIComponent(m.sha256)}`);
          show(result, h("p", { "data-testid": "store-removed" }, `Removed ${name} (${bytes(answer.removed.size)}) from the store of `, h("code", {}, answer.node), "."));
        } catch (err) {
          show(result, failureView(err.code, err.status, `Remove ${name}: ${err.message}`, "store-refusal"));
        }
        rerender();
      },
    },
    armed ? "Confirm remove" : "Remove",
  );
}

/** A link to the dashboard of the node whose store it is (where its Remove is), if known. */
function elsewhere(api) {
  if (!/^https?:\/\//.test(api || "")) return h("span", { class: "muted small" }, "on its node's page");
  return h("a", { class: "small", href: `${api}/`, target: "_blank", rel: "noopener" }, "on its node's page");
}

export function renderStore(target, snap, rerender) {
  const part = snap.store;
  if (!part) return unavailable(target, snap, "store", "The stores are not known yet.");
  const apis = new Map(((snap.nodes && snap.nodes.nodes) || []).map((n) => [n.node_id, n.api_address]));
  const rows = [];
  for (const s of stores(part)) {
    const here = s.node === part.node;
    const stored = s.stored || [];
    const nodeCell = h("td", { rowspan: Math.max(1, stored.length) }, h("code", {}, s.node), here ? " (this node)" : "", h("div", { class: "small muted" }, usage(s)));
    if (!stored.length) {
      rows.push(h("tr", { "data-testid": `store-${s.node}` }, nodeCell, h("td", { colspan: 5, class: "muted" }, "nothing stored")));
      continue;
    }
    stored.forEach((m, i) => {
      // The cluster's names for it (its cards) when it has any; else the store's own names.
      const names = (m.models || []).length ? m.models : m.names || [];
      const holders = m.holders || [];
      rows.push(
        h(
          "tr",
          { "data-testid": `stored-${s.node}-${m.sha256}`, "data-names": names.join(" ") },
          i === 0 ? nodeCell : null,
          h("td", { title: [`manifest sha256 ${m.sha256}`, ...(m.names || [])].join("\n") }, names.length ? names.join(", ") : h("code", {}, m.sha256.slice(0, 12))),
          h("td", { class: "nowrap" }, bytes(m.size)),
          h("td", { class: "nowrap", title: m.last_used ? clock(m.last_used) : "" }, m.last_used ? `${duration(snap.at - m.last_used)} ago` : "never"),
          h("td", {}, holders.length ? `${holders.length}: ${holders.join(", ")}` : "–"),
          h("td", {}, here ? removeButton(s.node, m, rerender) : elsewhere(apis.get(s.node))),
        ),
      );
    });
  }
  if (!rows.length) {
    show(target, h("p", { class: "muted" }, "No node has published its store yet."));
    return;
  }
  show(target, table(["node", "model", "size", "last used", "holders", ""], rows));
}
