// Pull a model from the Hugging Face Hub by its id (POST /v1/pulls, read as NDJSON): the pull's
// phases, the cluster's bytes, and per node the file in flight with its bytes, rate and ETA. A
// typed refusal (repo_not_found, gated, unsupported_architecture, disk_full, ...) is shown with
// its code, the node's message and what to do about it. Stopping only stops following: the
// download goes on in the cluster (it is under Downloads).
import { ApiFailure, ndjson } from "./api.js";
import { bytes, duration, h, progress, rate, show } from "./dom.js";

/** What to do about a pull's failure, by its code. */
export const REMEDIES = {
  repo_not_found: "Check the id (ORG/REPO, as on huggingface.co); a private repo needs HF_TOKEN on the nodes.",
  revision_not_found: "Check the revision after @ (a branch, tag or commit of the repo).",
  offline_missing: "The nodes are offline (HF_HUB_OFFLINE) and neither a store nor a Hub cache holds it.",
  gated: "The repo is gated: accept its terms on huggingface.co and set HF_TOKEN (with access) on the nodes.",
  unsupported_architecture: "mlx-lm cannot load this model's architecture: pick an MLX build of a supported family.",
  no_weights: "The repo has no safetensors weights: pick an MLX (safetensors) build of the model.",
  disk_full: "No node has room for it: free disk space, or raise --store-budget (Remove unused models under Stores).",
  hub_unreachable: "The Hub did not answer, after retries: check the nodes' network (or HF_ENDPOINT).",
  hash_mismatch: "The bytes kept failing verification against the Hub's hashes: try again later.",
  duplicate_download: "Another pull of this model is running: pull again to follow it.",
  model_exists: "Another pull of this model just finished or is running: pull again to follow it.",
  placement_info_pending: "The nodes have not published their stores yet: try again in a moment.",
  no_quorum: "The cluster has no leader right now: try again once it has one.",
};

const $ = (id) => document.getElementById(id);
let following = null; // the AbortController of the pull being followed
let seen = new Map(); // node → its last transfer of this pull (kept once it finishes)
let phases = [];

/** A name that is a Hub id (ORG/REPO[@REV]) rather than a path or a plain name. */
export function isHubId(name) {
  return /^[A-Za-z0-9][\w.-]*\/[\w.-]+(@\S+)?$/.test(name);
}

/** A failure as the page shows it: code (status): message, and the remedy when there is one. */
export function failureView(code, status, message, testid) {
  const head = code ? `${code}${status ? ` (${status})` : ""}: ` : "";
  return h(
    "div",
    { class: "failure", "data-testid": testid, "data-code": code || "" },
    h("p", { class: "refusal" }, head, message),
    REMEDIES[code] ? h("p", { class: "remedy" }, REMEDIES[code]) : null,
  );
}

function transferTable(status) {
  const live = new Set();
  for (const t of status.transfers || []) {
    live.add(t.node);
    seen.set(t.node, { ...t, finished: false });
  }
  for (const [node, t] of seen) {
    const held = !live.has(node) && (status.holders || []).includes(node);
    if (held || status.phase === "done") seen.set(node, { ...t, finished: true });
  }
  if (!seen.size) return null;
  const rows = [...seen.values()].sort((a, b) => a.node.localeCompare(b.node)).map((t) =>
    h(
      "tr",
      { "data-testid": `pull-transfer-${t.node}`, class: t.finished ? "finished" : "" },
      h("td", {}, h("code", {}, t.node)),
      h("td", {}, t.source === "hub" ? "the Hub" : "peers"),
      h("td", {}, t.finished ? "done" : t.file ? [h("code", {}, t.file), " ", progress(t.file_done, t.file_total)] : "–"),
      h("td", {}, t.finished ? progress(t.bytes_total, t.bytes_total) : progress(t.bytes_done, t.bytes_total)),
      h("td", {}, t.finished ? "–" : rate(t.rate_bps)),
      h("td", {}, t.finished ? "–" : duration(t.eta_s)),
    ),
  );
  const head = ["node", "from", "file", "model bytes", "rate", "ETA"];
  return h("table", {}, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), h("tbody", {}, rows));
}

function statusView(status) {
  if (!phases.includes(status.phase)) phases.push(status.phase);
  const target = $("pull-status");
  target.dataset.phase = status.phase;
  target.dataset.phases = phases.join(" ");
  const holders = status.holders || [];
  const nodes = status.nodes || [];
  const commit = status.commit ? ` @ ${status.commit.slice(0, 10)}` : "";
  const lines = [
    h(
      "p",
      {},
      h("code", {}, status.model),
      " ",
      h("span", { class: `phase ${status.phase}`, "data-testid": "pull-phase" }, status.phase),
      ` ${commit} · ${bytes(status.total_bytes)}`,
      status.downloader ? [" · downloaded by ", h("code", {}, status.downloader)] : null,
    ),
    h(
      "p",
      {},
      "Cluster: ",
      progress(status.done_bytes, status.target_bytes, { "data-testid": "pull-bytes" }),
      ` · held by ${holders.length} of ${nodes.length} node${nodes.length === 1 ? "" : "s"}`,
      holders.length ? [": ", holders.join(", ")] : null,
    ),
    transferTable(status),
  ];
  if (status.phase === "done") {
    lines.push(
      h(
        "p",
        { "data-testid": "pulled" },
        `Pulled ${status.model}: in the store of ${holders.length} node${holders.length === 1 ? "" : "s"}. `,
        h("button", { type: "button", id: "pull-place", onclick: () => placeIt(status.model) }, "Place it"),
      ),
    );
  }
  show(target, lines);
}

function placeIt(model) {
  const field = $("place-model");
  field.value = model;
  field.scrollIntoView({ block: "center" });
  field.focus();
}

function finish() {
  following = null;
  $("pull").disabled = false;
  $("pull-stop").hidden = true;
}

async function pull(model) {
  if (following) following.abort();
  const controller = new AbortController();
  following = controller;
  seen = new Map();
  phases = [];
  const target = $("pull-status");
  delete target.dataset.phase;
  target.dataset.phases = "";
  show(target, h("p", { class: "muted" }, `Checking ${model} on the Hub…`));
  $("pull").disabled = true;
  $("pull-stop").hidden = false;
  try {
    await ndjson("POST", "/v1/pulls", { model, stream: true }, (line) => {
      if (controller.signal.aborted) return;
      if (line.error) {
        target.dataset.phase = "failed";
        show(target, failureView(line.error.code, null, line.error.message, "pull-error"));
      } else {
        statusView(line);
      }
    }, { signal: controller.signal });
    if (!controller.signal.aborted && !["done", "failed"].includes(target.dataset.phase)) {
      target.append(h("p", { class: "muted", "data-testid": "pull-cut" }, "The stream ended before the pull was done; the download goes on in the cluster (see Downloads)."));
    }
  } catch (err) {
    if (controller.signal.aborted) return;
    target.dataset.phase = "failed";
    if (err instanceof ApiFailure) show(target, failureView(err.code, err.status, err.message, "pull-error"));
    else show(target, failureView(null, null, `The pull's stream broke: ${err.message}. The download goes on in the cluster: see Downloads.`, "pull-error"));
  } finally {
    if (following === controller) finish();
  }
}

export function installPull() {
  $("pull-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const model = $("pull-model").value.trim();
    if (!model) return;
    pull(model);
  });
  $("pull-stop").addEventListener("click", () => {
    if (!following) return;
    following.abort();
    finish();
    show($("pull-status"), h("p", { class: "muted" }, "Stopped following; the download goes on in the cluster (see Downloads)."));
  });
  window.addEventListener("pagehide", () => following && following.abort());
}
