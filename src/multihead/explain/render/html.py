"""Draw Stories as static HTML: inline CSS, heatmaps as inline SVG (render_svg), no scripts and no
external assets. `render_html` makes a whole page of one language; the interactive page (render/page.py)
draws its story section with the same block renderers, `DRAW`.
"""
from __future__ import annotations

from html import escape

from multihead.explain.words import ui
from multihead.explain.render.tensor_text import layout_line, slices, table_value, tensor_note
from multihead.explain.render.svg import heatmaps_svg
from multihead.explain.story import Block, Story

CSS = """
body { font: 15px/1.5 system-ui, "Noto Sans CJK SC", "Microsoft YaHei", sans-serif; margin: 0;
       background: #f7f7f4; color: #1d1d1f; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 2px solid #2a6f97; color: #2a6f97; }
pre { background: #1e2430; color: #e6e6e6; padding: 10px 14px; border-radius: 6px; overflow-x: auto;
      font: 13px/1.45 ui-monospace, "DejaVu Sans Mono", monospace; }
.tensor { margin: 10px 0; }
.tensor .label code { font-weight: bold; }
.layout { color: #7a2e8e; font-family: ui-monospace, monospace; font-size: 13px; margin-left: 8px; }
.slices { display: flex; flex-wrap: wrap; gap: 14px; margin-top: 4px; }
table { border-collapse: collapse; font: 12.5px ui-monospace, "DejaVu Sans Mono", monospace; background: #fff; }
caption { font-size: 12px; color: #666; text-align: left; }
th, td { padding: 2px 7px; border: 1px solid #ddd; text-align: right; }
th { background: #eef3f7; color: #444; font-weight: normal; }
table.data td, table.data th { text-align: left; font-family: system-ui, sans-serif; }
.check { margin: 4px 0; padding: 4px 10px; border-left: 4px solid; border-radius: 3px; }
.check.ok { border-color: #2e8540; background: #e9f5ec; }
.check.failed { border-color: #c0392b; background: #fbeaea; font-weight: bold; }
.detail { color: #666; font-size: 12.5px; margin-left: 8px; font-family: ui-monospace, monospace; }
.note { color: #777; font-size: 12.5px; }
figure { margin: 12px 0; }
.heatmaps .heads { display: flex; flex-wrap: wrap; gap: 10px 18px; align-items: flex-end; }
svg.heatmap { max-width: 100%; height: auto; background: #fff; }
svg.heatmap text { font: 11px system-ui, "Noto Sans CJK SC", "Microsoft YaHei", sans-serif; fill: #333; }
svg.heatmap text.title { font-size: 12px; font-weight: bold; }
svg.heatmap text.num { font-size: 10px; }
figcaption { color: #555; font-size: 13px; }
.summary { margin-top: 32px; padding: 12px 16px; font-weight: bold; border-radius: 6px; }
.summary.ok { background: #e9f5ec; color: #1e6b30; }
.summary.failed { background: #fbeaea; color: #a5281b; }
.question { font-style: italic; color: #444; }
"""


def _matrix_html(index: str, cells, row_labels, col_labels) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in ["", *col_labels])
    body = "".join(
        "<tr><th>" + escape(label) + "</th>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
        for label, row in zip(row_labels, cells, strict=True)
    )
    caption = f"<caption>{escape(index)}</caption>" if index else ""
    return f"<table>{caption}<tr>{head}</tr>{body}</table>"


def figure_image(block: Block, langs: tuple[str, ...] = ("en",)) -> str:
    """A figure block's heatmaps as inline SVG, labelled in each of `langs`."""
    return heatmaps_svg(block.data["weights"], block.data.get("tokens"), langs)


def _figure_html(block: Block, lang: str) -> str:
    return f"<figure>{figure_image(block, (lang,))}<figcaption>{escape(block.data['label'])}</figcaption></figure>"


def _tensor_html(block: Block, lang: str) -> str:
    value = block.data["value"]
    parts, total = slices(value, block.data.get("rows"), block.data.get("dims"), lang, block.data.get("tokens"))
    tables = "".join(_matrix_html(s.index, s.cells, s.row_labels, s.col_labels) for s in parts)
    note = tensor_note(block.data.get("dims"), len(parts), total, lang)
    note_html = f'<div class="note">{escape(note)}</div>' if note else ""
    return (f'<div class="tensor"><div class="label"><code>{escape(block.data["label"])}</code>'
            f'<span class="layout">{escape(layout_line(value, lang, block.data["layout"]))}</span></div>'
            f'<div class="slices">{tables}</div>{note_html}</div>')


def _table_html(block: Block, lang: str) -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in block.data["columns"])
    body = "".join("<tr>" + "".join(f"<td>{escape(table_value(c, lang))}</td>" for c in row) + "</tr>"
                   for row in block.data["rows"])
    caption = f"<caption>{escape(block.data['title'])}</caption>" if block.data["title"] else ""
    return f'<table class="data">{caption}<tr>{head}</tr>{body}</table>'


def _check_html(block: Block, lang: str) -> str:
    ok = block.data["ok"]
    mark = "✓" if ok else "✗ " + ui("failed", lang)
    detail = f'<span class="detail">{escape(block.data["detail"])}</span>' if block.data["detail"] else ""
    return f'<p class="check {"ok" if ok else "failed"}">{mark} {escape(block.data["claim"])}{detail}</p>'


DRAW = {
    "heading": lambda b, lang: f"<h2>{escape(b.data['text'])}</h2>",
    "text": lambda b, lang: f"<p>{escape(b.data['text'])}</p>",
    "code": lambda b, lang: f"<pre><code>{escape(b.data['source'])}</code></pre>",
    "tensor": _tensor_html,
    "table": _table_html,
    "check": _check_html,
    "figure": _figure_html,
}


def story_html(story: Story) -> str:
    """The body HTML of one story, block by block."""
    return "\n".join(DRAW[b.kind](b, story.lang) for b in story.blocks)


def summary_html(stories: list[Story], lang: str) -> str:
    total = sum(len(s.checks) for s in stories)
    failed = [claim for s in stories for claim in s.failed_checks]
    if not failed:
        return f'<div class="summary ok">{escape(ui("summary_ok", lang, n=total))}</div>'
    items = "".join(f"<li>{escape(claim)}</li>" for claim in failed)
    text = escape(ui("summary_failed", lang, k=len(failed), n=total))
    return f'<div class="summary failed">{text}<ul>{items}</ul></div>'


def render_html(stories: list[Story], lang: str, title: str | None = None) -> str:
    """A complete, self-contained HTML document for the stories, ending with the checks' summary."""
    title = title or ui("report_title", lang)
    body = "\n".join(f"<section>{story_html(s)}</section>" for s in stories)
    html_lang = "zh-CN" if lang == "zh" else "en"
    return (f'<!DOCTYPE html>\n<html lang="{html_lang}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n"
            f"<body><main><h1>{escape(title)}</h1>\n{body}\n{summary_html(stories, lang)}</main></body></html>\n")
