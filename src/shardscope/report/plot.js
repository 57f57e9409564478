// What every shardscope page inlines (`report.page.fill_page`): its data `D` (the page's embedded JSON) and
// the SVG helpers: `el` adds an element to an <svg>, `hover` shows `text` in the page's #tip while the pointer
// is over it, `axes` draws a chart's axes, five ticks on each (none on x when `xmax` is 0) and their labels.
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const NS = "http://www.w3.org/2000/svg", tip = document.getElementById("tip");
function el(svg, name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  svg.appendChild(e); return e;
}
function hover(e, text) {
  e.addEventListener("mousemove", ev => { tip.style.display = "block"; tip.style.left = (ev.clientX + 12) + "px";
    tip.style.top = (ev.clientY + 12) + "px"; tip.textContent = text; });
  e.addEventListener("mouseleave", () => { tip.style.display = "none"; });
}
function axes(svg, w, h, m, xmax, ymax, xl, yl) {
  el(svg, "line", {x1: m, y1: h - m, x2: w - 10, y2: h - m, stroke: "#444"});
  el(svg, "line", {x1: m, y1: 10, x2: m, y2: h - m, stroke: "#444"});
  for (let i = 0; i <= 5; i++) {
    const x = m + (w - m - 10) * i / 5, y = h - m - (h - m - 10) * i / 5;
    if (xmax) el(svg, "text", {x: x, y: h - m + 16, "font-size": 11, "text-anchor": "middle"}, (xmax * i / 5).toPrecision(3));
    el(svg, "text", {x: m - 6, y: y + 4, "font-size": 11, "text-anchor": "end"}, (ymax * i / 5).toPrecision(3));
  }
  el(svg, "text", {x: (w + m) / 2, y: h - 6, "text-anchor": "middle"}, xl);
  el(svg, "text", {x: 14, y: h / 2, transform: `rotate(-90 14 ${h / 2})`, "text-anchor": "middle"}, yl);
}
