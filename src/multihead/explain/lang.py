"""Which language `multihead explain` speaks, and the few words its renderers print themselves.

Everything a step or topic says comes through `Story.heading/text/check(en, zh)`; this module only
holds the renderers' own labels (check marks, summaries, table headers); the locale rule is
multihead.terminal.language's, shared by every command.
"""
from __future__ import annotations

from multihead.terminal.language import LOCALE_VARS, resolve_lang  # noqa: F401 - the one language rule, re-exported

UI: dict[str, tuple[str, str]] = {
    "failed": ("FAILED", "未通过"),
    "summary_ok": ("All {n} checks passed.", "全部 {n} 项检查都通过了。"),
    "summary_failed": ("{k} of {n} checks FAILED:", "{n} 项检查中有 {k} 项未通过："),
    "shape": ("shape", "形状"),
    "stride": ("stride", "步幅"),
    "contiguous": ("contiguous", "连续"),
    "yes": ("yes", "是"),
    "no": ("no", "否"),
    "showing": ("showing {shown} of {total}", "共 {total} 个，这里只显示 {shown} 个"),
    "head": ("head", "头"),
    "head_n": ("head {n}", "头 {n}"),
    "heat_legend": ("rows: queries, columns: keys; the darker, the more weight",
                    "行是查询，列是键；颜色越深，权重越大"),
    "true": ("True", "是"),
    "false": ("False", "否"),
    "axis_batch": ("batch", "样本"),
    "axis_token": ("token", "词元"),
    "axis_head": ("head", "头"),
    "axis_feature": ("feature", "特征"),
    "axis_batches": ("batch items", "样本"),
    "axis_tokens": ("tokens", "词元"),
    "axis_heads": ("heads", "头"),
    "axis_features": ("features", "特征"),
    "slice_axes": ("in each table the rows are {rows}, the columns {cols}", "每张表中，行是{rows}，列是{cols}"),
    "topics_title": ("Topics: multihead explain TOPIC", "主题：multihead explain 主题名"),
    "topic_col": ("name", "名称"),
    "doc_col": ("doc", "文档"),
    "question_col": ("question", "问题"),
    "documents_title": ("The documents the questions come from (docs/textbook.md describes each)",
                        "问题出自这些文档（docs/textbook.md 里逐一介绍了它们）"),
    "document_col": ("title and public source", "标题与公开来源"),
    "no_topics": ("No topics are installed yet.", "还没有可用的主题。"),
    "unknown_topic": ("Unknown topic {name!r}. Known: {known}.", "没有名为“{name}”的主题。现有主题：{known}。"),
    "unknown_topic_near": ("Unknown topic {name!r}. Did you mean: {near}? (all topics: multihead explain --list)",
                           "没有名为“{name}”的主题。你要找的是不是：{near}？（全部主题：multihead explain --list）"),
    "cannot_write": ("cannot write {path}: {reason}", "无法写入 {path}：{reason}"),
    "wrote_html": ("Wrote the interactive page to {path} ({size:.2f} MB)", "交互式页面已写入 {path}（{size:.2f} MB）"),
    "report_title": ("multihead explain", "multihead explain：多头注意力逐步讲解"),
}


def ui(key: str, lang: str, **values) -> str:
    """The renderer label `key` in `lang`, with {placeholders} filled from `values`."""
    en, zh = UI[key]
    return (zh if lang == "zh" else en).format(**values)
