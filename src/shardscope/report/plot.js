// SVG drawing helpers every shardscope page inlines (`report.page.fill_page`): `el` adds an element to an
// <svg>, `hover` shows `text` in the page's #tip while the pointer is over it.
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
