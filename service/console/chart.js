// Small SVG line charts (no library): series of [x, y] points with a grid, several ticks on each axis, a log
// scale when the values span decades, vertical marks (epochs), an optional second axis line of elapsed time,
// and a hover readout of the nearest point.

const NS = "http://www.w3.org/2000/svg";
const PAD = { left: 50, right: 12, top: 10, bottom: 22 };

function node(tag, attrs, text) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (text !== undefined) n.textContent = text;
  return n;
}

export function fmt(v) {
  if (v === 0) return "0";
  if (Number.isInteger(v)) return v.toLocaleString();
  const a = Math.abs(v);
  if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toPrecision(2);
}

// "1m 05s": elapsed or remaining time for people.
export function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

// About `n` round values between lo and hi (1, 2 or 5 times a power of ten apart), at least three.
function niceTicks(lo, hi, n) {
  for (let want = n; want <= 4 * n; want *= 2) {
    const ticks = roundTicks(lo, hi, want);
    if (ticks.length >= 3) return ticks;
  }
  return roundTicks(lo, hi, 4 * n);
}

function roundTicks(lo, hi, n) {
  const raw = (hi - lo) / Math.max(n, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

// Powers of ten in [lo, hi] (log10 units); with fewer than three, the 2s and 5s between them too.
function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) out.push(10 ** e);
  let ticks = out.filter((v) => Math.log10(v) >= lo - 1e-9 && Math.log10(v) <= hi + 1e-9);
  if (ticks.length < 3) {
    ticks = out.flatMap((v) => [v, 2 * v, 5 * v]).filter((v) => Math.log10(v) >= lo - 1e-9 && Math.log10(v) <= hi + 1e-9);
  }
  return ticks;
}

// series: [{name, color, points: [[x, y], ...]}]
// opts: yMin (a floor for the y range), log ("auto" | false), marks ([{x, label}] drawn as dashed verticals),
// timeOf (x -> elapsed seconds, for a second line of x labels), xName/yName (the hover readout's words),
// empty (the sentence shown without points).
export function drawChart(svg, series, opts = {}) {
  const W = Math.max(240, Math.round(svg.clientWidth || 400));
  const H = Math.max(140, Math.round(svg.clientHeight || 180));
  const pad = { ...PAD, bottom: opts.timeOf ? 34 : PAD.bottom };
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.removeAttribute("preserveAspectRatio");
  svg.replaceChildren();
  const pts = series.flatMap((s) => s.points);
  if (pts.length === 0) {
    svg.setAttribute("data-empty", "true");
    svg.append(node("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, opts.empty || "no data yet"));
    return;
  }
  svg.removeAttribute("data-empty");
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  const log = opts.log === "auto" && y0 > 0 && y1 / y0 >= 30;
  svg.setAttribute("data-scale", log ? "log" : "linear");
  if (!log && opts.yMin !== undefined) y0 = Math.min(y0, opts.yMin);
  if (x1 === x0) x1 = x0 + 1;
  const ty = log ? Math.log10 : (v) => v;
  let [ly0, ly1] = [ty(y0), ty(y1)];
  if (ly1 === ly0) {
    const d = Math.abs(ly0) * 0.1 || 1;
    [ly0, ly1] = [ly0 - (opts.yMin === undefined ? d : 0), ly1 + d];
  } else if (!log) {
    const d = (ly1 - ly0) * 0.05;
    ly1 += d;
    if (opts.yMin === undefined || ly0 > opts.yMin) ly0 -= d;
  }
  const sx = (x) => pad.left + ((x - x0) / (x1 - x0)) * (W - pad.left - pad.right);
  const sy = (y) => H - pad.bottom - ((ty(y) - ly0) / (ly1 - ly0)) * (H - pad.top - pad.bottom);

  const grid = node("g", { class: "grid" });
  const yTicks = log ? logTicks(ly0, ly1) : niceTicks(ly0, ly1, 4);
  for (const v of yTicks) {
    grid.append(node("line", { x1: pad.left, x2: W - pad.right, y1: sy(v), y2: sy(v) }));
    svg.append(node("text", { x: pad.left - 4, y: sy(v) + 4, "text-anchor": "end", class: "tick y" }, fmt(v)));
  }
  const integerX = pts.every((p) => Number.isInteger(p[0]));
  let xTicks = niceTicks(x0, x1, Math.max(2, Math.floor((W - pad.left) / 80)));
  if (integerX) xTicks = [...new Set(xTicks.map(Math.round))];
  for (const v of xTicks) {
    grid.append(node("line", { x1: sx(v), x2: sx(v), y1: pad.top, y2: H - pad.bottom }));
    svg.append(node("text", { x: sx(v), y: H - pad.bottom + 13, "text-anchor": "middle", class: "tick x" }, fmt(v)));
    const t = opts.timeOf ? opts.timeOf(v) : null;
    if (t !== null && t !== undefined) {
      svg.append(node("text", { x: sx(v), y: H - pad.bottom + 26, "text-anchor": "middle", class: "tick time" }, duration(t)));
    }
  }
  svg.prepend(grid);
  svg.append(
    node("line", { x1: pad.left, y1: H - pad.bottom, x2: W - pad.right, y2: H - pad.bottom, class: "axis" }),
    node("line", { x1: pad.left, y1: pad.top, x2: pad.left, y2: H - pad.bottom, class: "axis" }),
  );
  for (const m of opts.marks || []) {
    if (m.x < x0 || m.x > x1) continue;
    svg.append(node("line", { x1: sx(m.x), x2: sx(m.x), y1: pad.top, y2: H - pad.bottom, class: "mark" }),
      node("text", { x: sx(m.x) - 2, y: pad.top + 9, "text-anchor": "end", class: "mark-label" }, m.label));
  }
  for (const s of series) {
    if (s.points.length === 0) continue;
    svg.append(node("polyline", {
      points: s.points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "),
      stroke: s.color,
      "data-series": s.name,
      "data-count": s.points.length,
    }));
    if (s.points.length <= 40) {
      for (const [x, y] of s.points) svg.append(node("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: s.color }));
    }
  }
  hover(svg, series, { sx, sy, W, H, pad, opts });
}

// The nearest point under the pointer: a cursor line and "x · name value …" in the corner.
function hover(svg, series, { sx, sy, W, H, pad, opts }) {
  const cursor = node("line", { y1: pad.top, y2: H - pad.bottom, class: "cursor", visibility: "hidden" });
  const readout = node("text", { x: W - pad.right - 2, y: pad.top + 10, "text-anchor": "end", class: "readout" });
  const area = node("rect", { x: pad.left, y: pad.top, width: W - pad.left - pad.right, height: H - pad.top - pad.bottom,
    fill: "transparent", class: "hover-area" });
  svg.append(cursor, readout, area);
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const move = (e) => {
    const box = svg.getBoundingClientRect();
    const px = ((e.clientX - box.left) / box.width) * W;
    let best = xs[0];
    for (const x of xs) if (Math.abs(sx(x) - px) < Math.abs(sx(best) - px)) best = x;
    const parts = [`${opts.xName || "x"} ${fmt(best)}`];
    for (const s of series) {
      const p = s.points.find((q) => q[0] === best);
      if (p) parts.push(`${s.name} ${fmt(p[1])}`);
    }
    const t = opts.timeOf ? opts.timeOf(best) : null;
    if (t !== null && t !== undefined) parts.push(duration(t));
    cursor.setAttribute("x1", sx(best));
    cursor.setAttribute("x2", sx(best));
    cursor.setAttribute("visibility", "visible");
    readout.textContent = parts.join(" · ");
    svg.setAttribute("data-hover", readout.textContent);
  };
  area.addEventListener("mousemove", move);
  area.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    readout.textContent = "";
  });
}
