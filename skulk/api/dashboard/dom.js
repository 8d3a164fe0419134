// Building DOM and SVG nodes without innerHTML: names and messages from the cluster are text.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: h("td", {class: "x"}, "text", otherNode). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replace what `target` shows. */
export function show(target, ...children) {
  target.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

export function num(n, digits = 1) {
  return n === null || n === undefined || Number.isNaN(n) ? "–" : Number(n).toFixed(digits);
}

export function clock(at) {
  return new Date(at * 1000).toLocaleTimeString([], { hour12: false });
}

/** A transfer rate: bytes per second. */
export function rate(bps) {
  return bps === null || bps === undefined ? "–" : `${bytes(bps)}/s`;
}

/** A span of seconds, short: "45 s", "3 min 05 s", "2 h 10 min"; "–" for none. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** A progress bar with "done / total" beside it (a share of 0 when the total is unknown). */
export function progress(done, total, attrs) {
  const share = total ? Math.min(1, done / total) : 0;
  return h("span", { class: "fetch", ...attrs }, h("progress", { max: 1, value: share }), ` ${bytes(done)} / ${bytes(total)}`);
}
