// Chat with any model of the cluster, streamed (OpenAI Chat Completions over SSE), with each
// answer's time to first token and its decode rate.
import { call, stream } from "./api.js";
import { h, num, show } from "./dom.js";

const history = [];

export async function refreshModels() {
  const select = document.getElementById("chat-model");
  const datalist = document.getElementById("known-models");
  let ids = [];
  try {
    const answer = await call("GET", "/v1/models");
    ids = answer.data.map((m) => m.id);
  } catch {
    return; // the feed shows why the API is not answering
  }
  const current = select.value;
  if ([...select.options].map((o) => o.value).join(",") !== ids.join(",")) {
    show(select, ids.length ? ids.map((id) => h("option", { value: id }, id)) : h("option", { value: "" }, "no model placed"));
    if (ids.includes(current)) select.value = current;
  }
  const known = new Set(ids);
  try {
    const state = await call("GET", "/v1/cluster/state");
    for (const model of state.models || []) known.add(model.id);
  } catch {
    // the State is only a hint for the placement form
  }
  show(datalist, [...known].sort().map((id) => h("option", { value: id })));
}

function bubble(role, text) {
  return h("div", { class: `msg ${role}` }, h("span", { class: "text" }, text), h("div", { class: "stats" }));
}

export function installChat() {
  const form = document.getElementById("chat-form");
  const log = document.getElementById("chat-log");
  const input = document.getElementById("chat-input");
  const button = document.getElementById("chat-send");
  document.getElementById("chat-clear").addEventListener("click", () => {
    history.length = 0;
    show(log);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const model = document.getElementById("chat-model").value;
    const content = input.value.trim();
    if (!model || !content || button.disabled) return;
    input.value = "";
    history.push({ role: "user", content });
    log.append(bubble("user", content));
    const answer = bubble("assistant", "");
    answer.setAttribute("data-testid", "answer");
    log.append(answer);
    const text = answer.querySelector(".text");
    const stats = answer.querySelector(".stats");
    const body = {
      model,
      messages: history.slice(),
      max_tokens: Number(document.getElementById("chat-max").value) || 64,
      stream: true,
      stream_options: { include_usage: true },
    };
    button.disabled = true;
    const start = performance.now();
    let first = null;
    let tokens = null;
    let finish = null;
    try {
      await stream("POST", "/v1/chat/completions", body, (_name, data) => {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
        for (const choice of chunk.choices || []) {
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            if (first === null) first = performance.now();
            text.textContent += piece;
            answer.dataset.chunks = String(Number(answer.dataset.chunks || 0) + 1);
            log.scrollTop = log.scrollHeight;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      });
      const end = performance.now();
      history.push({ role: "assistant", content: text.textContent });
      const ttft = first === null ? null : first - start;
      const rate = first !== null && tokens > 1 && end > first ? ((tokens - 1) * 1000) / (end - first) : null;
      stats.textContent = `TTFT ${ttft === null ? "–" : `${num(ttft, 0)} ms`} · ${rate === null ? "–" : num(rate)} tok/s · ${tokens ?? "?"} tokens · ${finish ?? "?"}`;
      answer.setAttribute("data-done", "true");
    } catch (err) {
      history.pop();
      stats.textContent = `failed: ${err.message}`;
      answer.classList.add("failed");
      answer.setAttribute("data-done", "true");
    } finally {
      button.disabled = false;
    }
  });
}
