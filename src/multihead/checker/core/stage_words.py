"""What the core judge says (core/judge.py, core/stages.py), in English and Chinese: the stages by name, the
first stage that differs with its numbers, the core found right, the output gate, a PASS on the core."""

from __future__ import annotations

# message key -> (English, Chinese)
STAGE_TEXT = {
    "stage:scores": ("scores", "分数"),
    "stage:masked-scores": ("masked scores", "掩码后的分数"),
    "stage:weights": ("weights", "注意力权重"),
    "stage:per-head-output": ("per-head output", "每个头的输出"),
    "stage:merged-heads": ("merged heads", "合并后的多头输出"),
    "stage:projected-output": ("projected output", "输出投影之后的结果"),
    "at:batch": ("batch {n}", "第 {n} 个样本"),
    "at:head": ("head {n}", "第 {n} 个头"),
    "at:query": ("query {n}", "第 {n} 个查询"),
    "at:key": ("key {n}", "第 {n} 个键"),
    "at:column": ("from column {n}", "从第 {n} 列起"),
    "first-stage": ("first stage that differs, judged on your own tensors: {stage} ({where})",
                    "在你自己的张量上逐步检查，第一个出错的步骤是：{stage}（{where}）"),
    "stage-yours": ("yours:    {values}", "你的结果：{values}"),
    "stage-expected": ("expected: {values}", "应得结果：{values}"),
    "core-right": ("stage by stage on your own tensors, the attention core is right ({stages}); the difference "
                   "lies outside it: the projections, norms or rotary before it, or the output projection after it",
                   "在你自己的张量上逐步检查，注意力核心是对的（{stages}）；差别出在核心之外：核心之前的投影、"
                   "归一化或旋转位置编码，或者核心之后的输出投影"),
    "core-not-found": ("no attention core (q·k, a softmax over the keys, weights times v, or "
                       "scaled_dot_product_attention) was found in its forward, so no stage could be named",
                       "在它的 forward 里没有找到注意力核心（q·k、对键做 softmax、权重乘 v，或 "
                       "scaled_dot_product_attention），因此无法指出是哪一步出错"),
    "gate-judged": ("your output gate (sigmoid(gate) * attention, before the output projection, gate a linear map "
                    "of the input) sits outside attention: it was checked as a gate, not against a reference",
                    "你的输出门控（在输出投影之前计算 sigmoid(gate) * attention，gate 是输入的线性变换）位于注意力"
                    "之外：只按门控的形式检查过，没有和参考实现比较"),
    "gate-outside": ("your output gate sits outside attention; it was not checked",
                     "你的输出门控位于注意力之外，没有被检查"),
    "no-roles-core": ("which layers project queries, keys and values could not be told apart, so the projections "
                      "were judged only as what the core reads: q, k and v each an affine map of the input",
                      "无法分辨哪些层分别投影查询、键和值，因此投影部分只按注意力核心读到的内容来检查："
                      "q、k、v 各自都是输入的仿射变换"),
    "pass-core": ("PASS: {target}: its attention core is right on its own tensors (scores, mask, weights, "
                  "per-head output, merged heads; max error {error:.1e}), and every part around it was recognised",
                  "通过：{target}：在它自己的张量上，注意力核心完全正确（分数、掩码、权重、每个头的输出、多头合并；"
                  "最大误差 {error:.1e}），核心周围的每个部分也都识别出来了"),
}
