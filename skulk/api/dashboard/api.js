// The API as the page calls it: the operator's key on every request, JSON errors made
// readable, and server-sent events read from a fetch() body (EventSource cannot send a key).

const KEY_ITEM = "skulk.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

function headers(extra) {
  const all = { ...extra };
  const key = apiKey();
  if (key) all.Authorization = `Bearer ${key}`;
  return all;
}

/** An answer that is not 2xx: its status, and the message and code of its error envelope. */
export class ApiFailure extends Error {
  constructor(status, message, code, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const error = body && (typeof body.error === "object" ? body.error : body);
  const message = (error && (error.message || error.error)) || `HTTP ${response.status}`;
  return new ApiFailure(response.status, String(message), error && error.code, body);
}

/** fetch() with the key; JSON bodies in and out; ApiFailure for a non-2xx answer. */
export async function call(method, path, body, { signal } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), signal };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : response.json();
}

/** POST (or GET) a route that answers server-sent events; onEvent(name, data) per event.
 *  Resolves when the stream ends; rejects with ApiFailure when the route refuses. */
export async function stream(method, path, body, onEvent, { signal } = {}) {
  const init = { method, headers: headers({ Accept: "text/event-stream" }), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

/** POST a route that answers NDJSON (one JSON object a line); onLine(obj) per line.
 *  Resolves when the stream ends; rejects with ApiFailure when the route refuses. */
export async function ndjson(method, path, body, onLine, { signal } = {}) {
  const init = { method, headers: headers({ Accept: "application/x-ndjson", "Content-Type": "application/json" }), signal };
  init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  const take = (line) => {
    if (line.trim()) onLine(JSON.parse(line));
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      take(buffer.slice(0, end));
      buffer = buffer.slice(end + 1);
    }
  }
  take(buffer);
}
