// Small SVG line charts (no library): series of [x, y] points drawn into a fixed viewBox.

const NS = "http://www.w3.org/2000/svg";
const W = 400;
const H = 180;
const PAD = { left: 44, right: 8, top: 8, bottom: 20 };

function node(tag, attrs, text) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (text !== undefined) n.textContent = text;
  return n;
}

function fmt(v) {
  if (Number.isInteger(v)) return v.toLocaleString();
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toPrecision(2);
}

// series: [{name, color, points: [[x, y], ...]}]
export function drawChart(svg, series, { yMin } = {}) {
  svg.replaceChildren();
  const pts = series.flatMap((s) => s.points);
  if (pts.length === 0) {
    svg.append(node("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "waiting for data…"));
    return;
  }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (yMin !== undefined) y0 = Math.min(y0, yMin);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + (Math.abs(y0) || 1) * 0.1;
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  svg.append(
    node("line", { x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom, stroke: "#c5cbd5" }),
    node("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom, stroke: "#c5cbd5" }),
    node("text", { x: PAD.left - 4, y: PAD.top + 9, "text-anchor": "end" }, fmt(y1)),
    node("text", { x: PAD.left - 4, y: H - PAD.bottom, "text-anchor": "end" }, fmt(y0)),
    node("text", { x: PAD.left, y: H - 4 }, fmt(x0)),
    node("text", { x: W - PAD.right, y: H - 4, "text-anchor": "end" }, fmt(x1)),
  );
  for (const s of series) {
    if (s.points.length === 0) continue;
    const line = node("polyline", {
      points: s.points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "),
      stroke: s.color,
      "data-series": s.name,
      "data-count": s.points.length,
    });
    svg.append(line);
    if (s.points.length === 1) {
      const [x, y] = s.points[0];
      svg.append(node("circle", { cx: sx(x), cy: sy(y), r: 3, fill: s.color }));
    }
  }
}
