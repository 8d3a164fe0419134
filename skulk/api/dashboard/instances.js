// Instances (each rank's node, runner phase, weight-fetch progress, load and KV use) and the
// placement form: Preview is a dry run (the plan, or the refusal with its arithmetic), Place
// commits, Remove deletes an instance. The model may be a Hub id (ORG/REPO[@REV]): one not yet
// in the cluster is pulled first (its progress shows under Models, Downloads).
import { ApiFailure, call } from "./api.js";
import { bytes, h, num, show } from "./dom.js";
import { REMEDIES, isHubId } from "./pull.js";

let confirming = null; // the instance whose Remove was pressed once

function servingOf(snap) {
  const stats = new Map();
  for (const row of (snap.nodes && snap.nodes.nodes) || []) {
    for (const r of row.serving || []) stats.set(`${r.instance_id}/${r.rank}`, r);
  }
  return stats;
}

function fetchCell(runner) {
  if (runner.bytes_total === null || runner.bytes_total === undefined) return "";
  const share = runner.bytes_total ? runner.bytes_done / runner.bytes_total : 0;
  return h("span", { class: "fetch" }, h("progress", { max: 1, value: share }), ` ${bytes(runner.bytes_done)} / ${bytes(runner.bytes_total)}`);
}

function kvCell(stat) {
  if (!stat || !stat.kv_capacity_bytes) return "–";
  return `${num((100 * stat.kv_used_bytes) / stat.kv_capacity_bytes)} % of ${bytes(stat.kv_capacity_bytes)}`;
}

function removeButton(inst, rerender) {
  const armed = confirming === inst.id;
  return h(
    "button",
    {
      type: "button",
      class: armed ? "danger" : "",
      "data-testid": `remove-${inst.id}`,
      onclick: async () => {
        if (!armed) {
          confirming = inst.id;
          rerender();
          return;
        }
        confirming = null;
        try {
          await call("DELETE", `/v1/instances/${encodeURIComponent(inst.id)}`);
        } catch (err) {
          alertBox(`Remove failed: ${err.message}`);
        }
        rerender();
      },
    },
    armed ? "Confirm remove" : "Remove",
  );
}

function alertBox(message) {
  show(document.getElementById("place-result"), h("p", { class: "refusal" }, message));
}

export function renderInstances(target, snap, rerender) {
  const list = (snap.instances && snap.instances.instances) || [];
  if (!list.length) {
    show(target, h("p", { class: "muted" }, snap.errors && snap.errors.instances ? snap.errors.instances : "No instances placed. Place one below."));
    return;
  }
  const stats = servingOf(snap);
  const rows = [];
  for (const inst of list) {
    inst.shards.forEach((shard, i) => {
      const stat = stats.get(`${inst.id}/${shard.rank}`);
      const phase = shard.runner.phase;
      rows.push(
        h(
          "tr",
          { "data-testid": `instance-${inst.id}-r${shard.rank}` },
          i === 0 ? h("td", { rowspan: inst.shards.length }, h("code", {}, inst.id)) : null,
          i === 0 ? h("td", { rowspan: inst.shards.length }, inst.model) : null,
          i === 0 ? h("td", { rowspan: inst.shards.length }, inst.sharding) : null,
          h("td", {}, `r${shard.rank}`),
          h("td", {}, h("code", {}, shard.node)),
          h("td", {}, `${shard.layers[0]}–${shard.layers[1]}`),
          h("td", {}, h("span", { class: `phase ${phase}`, "data-testid": `phase-${inst.id}-r${shard.rank}`, title: shard.runner.failure || "" }, phase), " ", fetchCell(shard.runner)),
          h("td", {}, stat ? `${stat.running} / ${stat.waiting}` : "–"),
          h("td", {}, stat ? num(stat.tokens_per_s) : "–"),
          h("td", {}, stat && stat.ttft_p50_s !== null && stat.ttft_p50_s !== undefined ? `${num(stat.ttft_p50_s * 1000, 0)} ms` : "–"),
          h("td", {}, kvCell(stat)),
          i === 0 ? h("td", { rowspan: inst.shards.length }, removeButton(inst, rerender)) : null,
        ),
      );
    });
  }
  const head = ["instance", "model", "sharding", "rank", "node", "layers", "runner", "running / waiting", "tok/s", "TTFT p50", "KV use", ""];
  show(target, h("table", {}, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), h("tbody", {}, rows)));
}

/** The node checkboxes of the placement form, keeping what the operator ticked. */
export function renderNodeChoices(target, snap) {
  const rows = (snap.nodes && snap.nodes.nodes) || [];
  const ids = rows.map((r) => r.node_id).sort();
  const have = [...target.querySelectorAll("input")].map((i) => i.value);
  if (have.join(",") === ids.join(",")) return;
  const ticked = new Set([...target.querySelectorAll("input:checked")].map((i) => i.value));
  show(target, ids.map((id) => h("label", { class: "check" }, h("input", { type: "checkbox", value: id, checked: ticked.has(id) }), id)));
}

function placement(dryRun) {
  const body = {
    model: document.getElementById("place-model").value.trim(),
    sharding: document.getElementById("place-sharding").value,
  };
  const nodes = [...document.querySelectorAll("#place-nodes input:checked")].map((i) => i.value);
  if (nodes.length) body.nodes = nodes;
  if (dryRun) body.dry_run = true;
  return body;
}

function planTable(plan) {
  return h(
    "table",
    { "data-testid": "plan" },
    h("thead", {}, h("tr", {}, ["rank", "node", "layers", "needs", "available"].map((c) => h("th", {}, c)))),
    h("tbody", {}, plan.shards.map((sh) => h("tr", {}, h("td", {}, `r${sh.rank}`), h("td", {}, h("code", {}, sh.node)), h("td", {}, `${sh.layers[0]}–${sh.layers[1]}`), h("td", {}, bytes(sh.need_bytes)), h("td", {}, bytes(sh.available_bytes))))),
  );
}

function refusal(err) {
  const typed = err instanceof ApiFailure && err.code;
  const code = typed ? `${err.code} (${err.status}): ` : "";
  const remedy = typed && REMEDIES[err.code];
  return [h("p", { class: "refusal", "data-testid": "refusal" }, code, err.message), remedy ? h("p", { class: "remedy" }, remedy) : null];
}

/** Whether the model is a Hub id the cluster has no card of (the placement pulls it first). */
function toPull(model) {
  if (!isHubId(model)) return false;
  const known = [...document.querySelectorAll("#known-models option")].map((o) => o.value);
  return !known.includes(model);
}

export function installPlacement(refreshModels) {
  const form = document.getElementById("place-form");
  const result = document.getElementById("place-result");
  const send = async (dryRun) => {
    const body = placement(dryRun);
    if (!body.model) {
      show(result, h("p", { class: "refusal" }, "Name a model first."));
      return;
    }
    const pulling = toPull(body.model)
      ? ` ${body.model} is pulled from the Hub first: its progress shows under Models, Downloads.`
      : "";
    show(result, h("p", { class: "muted", "data-testid": "placing" }, dryRun ? "Planning…" : "Placing…", pulling));
    try {
      const answer = await call("POST", "/v1/placements", body);
      if (answer.plan) {
        show(result, h("p", {}, `Plan for ${answer.plan.model} (${answer.plan.sharding}), nothing committed:`), planTable(answer.plan));
      } else {
        const id = answer.instance ? answer.instance.id : "?";
        show(result, h("p", { "data-testid": "placed" }, "Placed instance ", h("code", {}, id), ": it appears under Instances as it loads."));
        refreshModels();
      }
    } catch (err) {
      show(result, refusal(err));
    }
  };
  document.getElementById("preview").addEventListener("click", () => send(true));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send(false);
  });
}
