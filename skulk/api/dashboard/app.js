// The dashboard: one live feed (GET /v1/dashboard/events, a snapshot each second) drives every
// panel (the Models view's downloads and stores too); forms call the API directly. Any node
// serves it, and shows the whole cluster.
import { ApiFailure, apiKey, setApiKey, stream } from "./api.js";
import { installChat, refreshModels } from "./chat.js";
import { installPlacement, renderInstances, renderNodeChoices } from "./instances.js";
import { renderDownloads, renderStore } from "./models.js";
import { installPull } from "./pull.js";
import { renderTimeline, installRequestTimeline } from "./timeline.js";
import { renderTopology } from "./topology.js";

const $ = (id) => document.getElementById(id);
let last = null;
let feed = null; // the AbortController of the open feed
let modelsSeen = "";

function setFeed(state, text) {
  const pill = $("feed");
  pill.dataset.state = state;
  pill.textContent = text;
}

function render(snap) {
  last = snap;
  $("via").textContent = `via ${snap.node_id}`;
  const leader = snap.raft && snap.raft.leader;
  $("leader").textContent = leader ? `leader ${leader} · term ${snap.raft.term}` : "no leader";
  renderTopology($("topology"), $("node-detail"), snap);
  renderInstances($("instances"), snap, () => render(last));
  renderDownloads($("downloads"), snap);
  renderStore($("stores"), snap, () => render(last));
  renderNodeChoices($("place-nodes"), snap);
  renderTimeline($("timeline"), snap);
  // The chat's model list follows the instances, and the placement's suggestions the models
  // pulled into the cluster (a change is worth a /v1/models call).
  const instances = ((snap.instances && snap.instances.instances) || []).map((i) => `${i.model}:${i.status}`);
  const pulled = ((snap.store && snap.store.models) || []).map((m) => m.model);
  const models = [...instances, ...pulled].sort().join(",");
  if (models !== modelsSeen) {
    modelsSeen = models;
    refreshModels();
  }
}

async function connect() {
  if (feed) feed.abort();
  const controller = new AbortController();
  feed = controller;
  let delay = 500;
  while (!controller.signal.aborted) {
    setFeed("connecting", "connecting");
    try {
      await stream("GET", "/v1/dashboard/events", undefined, (name, data) => {
        if (name !== "snapshot") return;
        setFeed("live", "live");
        delay = 500;
        render(JSON.parse(data));
      }, { signal: controller.signal });
      setFeed("down", "feed ended; reconnecting");
    } catch (err) {
      if (controller.signal.aborted) return;
      if (err instanceof ApiFailure && err.status === 401) {
        setFeed("key", "API key needed");
        $("key").focus();
        return; // the key form reconnects
      }
      setFeed("down", "node unreachable; retrying");
    }
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 5000);
  }
}

$("key").value = apiKey();
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("key").value.trim());
  modelsSeen = "";
  connect();
});
window.addEventListener("pagehide", () => feed && feed.abort());
installPlacement(refreshModels);
installPull();
installChat();
installRequestTimeline();
connect();
