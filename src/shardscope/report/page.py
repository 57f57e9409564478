"""Fill one of the self-contained HTML page templates (the plan report's, the serving page's): the shared
SVG helpers (`plot.js`), the escaped title and the data as embedded JSON; nothing is fetched."""

from __future__ import annotations

import html
import json
from importlib import resources


def fill_page(template: str, title: str, data: dict) -> str:
    plot = (resources.files("shardscope.report") / "plot.js").read_text()
    page = template.replace("__PLOT_JS__", plot).replace("__TITLE__", html.escape(title))
    return page.replace("__DATA__", json.dumps(data).replace("</", "<\\/"))
