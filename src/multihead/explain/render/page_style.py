"""The interactive page's own CSS (the story below it uses render_html.CSS): the bar with the language
switch, the three views, and the rule that shows only the chosen language."""

PAGE_CSS = """
html[data-lang="en"] .l-zh, html[data-lang="zh"] .l-en { display: none !important; }
header.bar { position: sticky; top: 0; z-index: 5; display: flex; align-items: center; gap: 16px;
             justify-content: space-between; background: #1e2430; color: #fff; padding: 8px 32px; }
header.bar h1 { font-size: 18px; margin: 0; color: #fff; }
.lang-switch button { font: inherit; font-size: 13px; border: 1px solid #8a9bb0; background: transparent;
                      color: #fff; padding: 2px 12px; cursor: pointer; }
.lang-switch button.on { background: #2a6f97; border-color: #2a6f97; }
.panel { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 12px 16px; margin: 16px 0; }
.panel h3 { margin: 0 0 4px; font-size: 16px; color: #2a6f97; }
.hint, .note { color: #666; font-size: 13px; margin: 4px 0 8px; }
.tabs button, .modes button { font: inherit; font-size: 13px; border: 1px solid #bbb; background: #fff;
                              padding: 2px 10px; margin: 0 6px 6px 0; cursor: pointer; border-radius: 3px; }
.tabs button.on, .modes button.on { background: #2a6f97; color: #fff; border-color: #2a6f97; }
.grid { display: grid; gap: 3px; align-items: center; justify-content: start; overflow-x: auto;
        padding-bottom: 4px; }
.rowlabel, .collabel { font-size: 11px; color: #666; white-space: nowrap; text-align: center; }
.rowlabel { text-align: right; padding-right: 6px; }
.cell { padding: 0; border: 2px solid transparent; background: #fff; cursor: pointer; line-height: 0;
        border-radius: 3px; justify-self: center; }
.cell canvas { width: 46px; height: 46px; image-rendering: pixelated; border: 1px solid #ddd; }
.cell:hover { border-color: #9cc3d8; }
.cell.selected { border-color: #e07a1f; }
.headview { display: flex; align-items: flex-start; overflow-x: auto; padding: 2px 2px 6px; }
.tokens { display: flex; flex-direction: column; min-width: 90px; }
.tokens .side { height: 22px; font-size: 11px; color: #888; margin-top: -22px; }
.tokens.left .side { text-align: right; padding-right: 6px; }
.token { height: 22px; line-height: 22px; padding: 0 6px; font: 13px ui-monospace, "DejaVu Sans Mono", monospace;
         white-space: nowrap; border-radius: 3px; }
.tokens.left .token { text-align: right; cursor: pointer; }
.token.focus, .token:focus-visible { outline: 2px solid #e07a1f; }
.token.chosen .name { font-weight: bold; text-decoration: underline; }
.token .w { font-size: 10px; color: #1d1d1f; margin: 0 4px; }
canvas.lines { flex: none; margin-top: 0; }
.headview .tokens, .headview canvas.lines { margin-top: 22px; }
.steps .step { display: grid; grid-template-columns: minmax(0, 7fr) minmax(0, 4fr); gap: 6px 14px;
               border-top: 1px solid #eee; padding: 8px 0; }
.step h4 { grid-column: 1 / -1; margin: 0; font-size: 14px; color: #333; }
.nums { overflow-x: auto; }
table.keyrow td { font-size: 12px; }
table.keyrow td.blocked { color: #a5281b; }
.vec { margin: 2px 0 6px; }
.vec .vecname { font-size: 12px; color: #555; }
.vec code { font: 12px ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-all; }
ul.checks { list-style: none; margin: 0; padding: 0; font-size: 12.5px; }
ul.checks li { border-left: 3px solid #2e8540; background: #e9f5ec; padding: 2px 6px; margin: 2px 0; }
ul.checks li.failed { border-color: #c0392b; background: #fbeaea; font-weight: bold; }
ul.checks li.none { border-color: #ccc; background: #f4f4f4; color: #777; }
section.story { margin-top: 24px; }
@media (max-width: 600px) {
  main { padding: 12px 10px 48px; }
  header.bar { padding: 6px 10px; flex-wrap: wrap; gap: 6px; }
  header.bar h1 { font-size: 15px; }
  .panel { padding: 8px 8px; }
  .tokens { min-width: 0; }
  .token { padding: 0 3px; font-size: 12px; }
  .steps .step { grid-template-columns: minmax(0, 1fr); }
  table { display: block; max-width: 100%; overflow-x: auto; }   /* a wide table scrolls, not the page */
}
"""
