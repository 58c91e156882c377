"""Every sentence the checker says, in English and Chinese (``lang="en"`` or ``"zh"``)."""

from __future__ import annotations

from multihead.errors import AttentionError

LANGS = ("en", "zh")

# bug id -> (English, Chinese): one line saying what the code does wrong and what it should do
BUG_TEXT = {
    "reshape-without-transpose": (
        "Heads are split with reshape(B, H, L, D) directly: each head gets a slice of the flat memory "
        "that mixes tokens. Reshape to (B, L, H, D), then transpose(1, 2).",
        "拆分多头时直接 reshape(B, H, L, D)：按内存顺序切分会把不同词的特征混进同一个头。"
        "应先 reshape 成 (B, L, H, D)，再 transpose(1, 2)。"),
    "merge-without-transpose": (
        "Heads are merged with reshape(B, L, E) straight from (B, H, L, D): heads and tokens get mixed. "
        "transpose(1, 2) back to (B, L, H, D) first.",
        "合并多头时直接把 (B, H, L, D) reshape 成 (B, L, E)，头和词的位置被打乱了。"
        "应先 transpose(1, 2) 变回 (B, L, H, D) 再合并。"),
    "softmax-wrong-axis": (
        "softmax normalises over the wrong axis: each query's weights must sum to 1 over the keys "
        "(dim=-1 of the (B, H, Lq, Lk) scores).",
        "softmax 的维度不对：每个查询对所有键的注意力权重之和应为 1，"
        "即在 (B, H, Lq, Lk) 分数的最后一维（dim=-1）上做 softmax。"),
    "missing-scale": (
        "The scores are not scaled: divide q @ k^T by sqrt(head_dim) before the softmax.",
        "注意力分数没有缩放：softmax 之前要把 q @ k^T 除以 sqrt(head_dim)。"),
    "scale-by-embed-dim": (
        "The scores are divided by sqrt(embed_dim); the scale is 1 / sqrt(head_dim), the size of one head.",
        "分数除以了 sqrt(embed_dim)；缩放因子应是 1 / sqrt(head_dim)，即单个头的维度。"),
    "scale-halved": (
        "The scores are divided by 2 * sqrt(head_dim): the scale is half of 1 / sqrt(head_dim). "
        "Divide by sqrt(head_dim) exactly once.",
        "分数除以了 2 * sqrt(head_dim)：缩放因子只有 1 / sqrt(head_dim) 的一半。"
        "只需除以一次 sqrt(head_dim)。"),
    "scale-by-head-dim": (
        "The scores are divided by head_dim instead of sqrt(head_dim) (or 1/sqrt(head_dim) is applied twice, "
        "to q and to k): splitting the scale over q and k takes head_dim ** -0.25 on each.",
        "分数除以了 head_dim，而不是 sqrt(head_dim)（或者 q 和 k 各乘了一次 1/sqrt(head_dim)）："
        "若把缩放分摊到 q 和 k 上，每边应乘 head_dim ** -0.25。"),
    "wrong-scale": (
        "The scores are multiplied by a factor other than 1 / sqrt(head_dim) before the softmax "
        "(the measured factor is in the notes).",
        "softmax 之前分数乘的缩放因子不是 1 / sqrt(head_dim)（实测的因子见下方说明）。"),
    "scale-after-softmax": (
        "The scale is applied after the softmax, so the weights no longer sum to 1. "
        "Scale the scores, then take the softmax.",
        "缩放放在了 softmax 之后，注意力权重之和不再是 1。应先缩放分数，再做 softmax。"),
    "mask-after-softmax": (
        "The mask is applied after the softmax: masked positions must be filled with -inf (masked_fill) "
        "before the softmax, so the remaining weights still sum to 1.",
        "掩码放在了 softmax 之后：应在 softmax 之前用 masked_fill 把被屏蔽的位置填成 -inf，"
        "这样剩下的注意力权重之和仍为 1。"),
    "mask-filled-with-zero": (
        "Blocked scores are filled with 0 (or multiplied by the mask) before the softmax: exp(0) = 1, so "
        "blocked keys still get weight. Fill them with -inf (masked_fill(~keep, float('-inf'))).",
        "在 softmax 之前把被屏蔽的分数填成了 0（或乘以掩码）：exp(0) = 1，被屏蔽的键仍然分到权重。"
        "应填成 -inf（masked_fill(~keep, float('-inf'))）。"),
    "mask-wrong-rows": (
        "The mask reaches the wrong batch rows: with heads folded into the batch as (B*H), row b*H + h "
        "belongs to batch b, so the mask must be repeated with repeat_interleave(H, dim=0), not repeat(H, 1, 1).",
        "掩码作用到了错误的批次行上：把多头折叠进批量 (B*H) 后，第 b*H + h 行属于第 b 个样本，"
        "所以掩码应该用 repeat_interleave(H, dim=0) 复制，而不是 repeat(H, 1, 1)。"),
    "no-output-projection": (
        "The output projection is defined but never applied: pass the merged heads through it.",
        "定义了输出投影层却没有使用：合并多头之后还要经过这个线性层。"),
    "causal-off-by-one": (
        "The causal mask is off by one: token i must see tokens 0..i, itself included "
        "(triu(ones(L, L), diagonal=1) marks what to block).",
        "因果掩码错了一位：第 i 个词应能看到第 0..i 个词（包括它自己），"
        "应屏蔽的是 triu(ones(L, L), diagonal=1)。"),
    "keys-used-as-values": (
        "The attention weights multiply the keys; they must multiply the values (weights @ v).",
        "注意力权重乘的是键 K，应该乘值 V（weights @ v）。"),
    "scores-without-key-transpose": (
        "The scores are q @ k without transposing k: use q @ k.transpose(-2, -1) so that every query "
        "meets every key.",
        "计算分数时没有转置 K：应写 q @ k.transpose(-2, -1)，让每个查询与每个键做点积。"),
    "view-on-non-contiguous": (
        "view() is called on a transposed (non-contiguous) tensor: call .contiguous() first, or use "
        "reshape().",
        "在转置后（内存不连续）的张量上调用了 view()：先调用 .contiguous()，或改用 reshape()。"),
    "forward-misspelled": (
        "The class has no forward method (nn.Module calls forward); '{method}' looks like a misspelling "
        "of it.",
        "这个类没有 forward 方法（nn.Module 调用的是 forward）；'{method}' 像是 forward 的拼写错误。"),
    "mask-ignored": (
        "The mask has no effect on the output. masked_fill returns a new tensor: assign it "
        "(scores = scores.masked_fill(...)) or use the in-place masked_fill_.",
        "掩码对输出没有任何影响。masked_fill 会返回一个新张量：要把结果赋值回去"
        "（scores = scores.masked_fill(...)），或者使用原地操作 masked_fill_。"),
}

# convention key -> (English, Chinese)
CONVENTION_TEXT = {
    "inputs:x": ("forward({args}): self-attention on one input", "forward({args})：单输入自注意力"),
    "inputs:qkv": ("forward({args}): separate query, key, value", "forward({args})：查询、键、值分别输入"),
    "inputs:q_kv": ("forward({args}): query, and one tensor for keys and values",
                    "forward({args})：查询，以及键值共用的一个输入"),
    "order:qkv": ("arguments told apart by behaviour: query '{q}', key '{k}', value '{v}'",
                  "从行为判断出的参数：查询是 '{q}'，键是 '{k}'，值是 '{v}'"),
    "order:q_kv": ("arguments told apart by behaviour: query '{q}', keys and values '{k}'",
                   "从行为判断出的参数：查询是 '{q}'，键和值都来自 '{k}'"),
    "pre": ("its projections read the output of '{name}' ({kind}, inside the module): the attention is "
            "checked on that", "它的投影层读的是模块内部 '{name}'（{kind}）的输出：注意力按这个输入来检查"),
    "layout:batch": ("batch first (B, L, E)", "批量在前 (B, L, E)"),
    "layout:seq": ("sequence first (L, B, E)", "序列在前 (L, B, E)"),
    "causal:yes": ("causal inside the module (it masks future tokens){buffer}",
                   "模块内部带因果掩码（屏蔽后面的词）{buffer}"),
    "causal:no": ("not causal", "非因果"),
    "causal:after-softmax": ("causal through buffer '{buffer}', applied after the softmax",
                             "通过缓冲区 '{buffer}' 实现因果，但放在了 softmax 之后"),
    "mask:none": ("no mask argument", "没有掩码参数"),
    "mask:ignored": ("mask argument '{param}': has no effect on the outputs",
                     "掩码参数 '{param}'：对输出没有任何影响"),
    "mask:unknown": ("mask argument '{param}': convention not recognised, compared without masks",
                     "掩码参数 '{param}'：无法识别其约定，只比较了不带掩码的情况"),
    "cross-lengths": ("Lq != Lk accepted", "支持 Lq != Lk"),
    "cross-lengths:equal": ("needs Lq == Lk (compared with equal lengths)", "要求 Lq == Lk（只用等长输入比较）"),
    "heads": ("{heads} heads of size {head_dim}", "{heads} 个头，每个头 {head_dim} 维"),
    "kv-heads": ("key/value heads: {kv_heads}, each shared by a group of query heads (GQA)",
                 "键/值头：{kv_heads} 个，每个由一组查询头共享（GQA）"),
    "dtype:float32": ("runs in float32 only (compared in float32)", "只能在 float32 下运行（按 float32 比较）"),
}

# mask encoding name -> (English, Chinese)
MASK_TEXT = {
    "keep": ("mask '{param}' {shape}: True/1 = may attend", "掩码 '{param}' {shape}：True/1 = 可以关注"),
    "block": ("mask '{param}' {shape}: True/1 = blocked", "掩码 '{param}' {shape}：True/1 = 被屏蔽"),
    "block01": ("mask '{param}' {shape}: 0/1 floats, 1 = blocked (times a large negative number)",
                "掩码 '{param}' {shape}：0/1 浮点数，1 = 被屏蔽（乘以一个很大的负数）"),
    "additive": ("mask '{param}' {shape}: added to the scores, -inf = blocked",
                 "掩码 '{param}' {shape}：加到注意力分数上，-inf = 被屏蔽"),
    "causal-switch": ("mask '{param}': any mask switches causal masking on (its values are not read); checked "
                      "with the causal pattern", "掩码 '{param}'：只要传入掩码就会启用因果屏蔽（不读取掩码的值）；"
                      "按因果模式检查"),
    "lengths": ("valid lengths '{param}' {shape}: keys j < len are kept",
                "有效长度 '{param}' {shape}：只保留 j < len 的键"),
}

ROLE_TEXT = {"q": ("query", "查询"), "k": ("key", "键"), "v": ("value", "值"), "o": ("output", "输出")}

MESSAGES = {
    "pass": ("PASS: {target} matches multihead.MultiHeadAttention (forward and gradients, max error {error:.1e})",
             "通过：{target} 与 multihead.MultiHeadAttention 一致（前向和梯度，最大误差 {error:.1e}）"),
    "fail-bug": ("FAIL: {target}: {bug}", "未通过：{target}：{bug}"),
    "fail-unknown": ("FAIL: {target} differs from the reference (max error {error:.2e}) in a way the "
                     "catalogue does not know", "未通过：{target} 与参考实现不一致（最大误差 {error:.2e}），"
                     "不属于已知错误"),
    "fail-grad": ("FAIL: {target}: outputs match but gradients differ (max error {error:.2e})",
                  "未通过：{target}：输出一致但梯度不一致（最大误差 {error:.2e}）"),
    "fail-reason": ("FAIL: {target}: {reason}", "未通过：{target}：{reason}"),
    "fail-shape": ("FAIL: {target}: {shape}", "未通过：{target}：输出形状不对：{shape}"),
    "fail-raises": ("FAIL: {target} raises {exception}", "未通过：{target} 运行时报错 {exception}"),
    "error": ("ERROR: could not check {target}: {reason}", "错误：无法检查 {target}：{reason}"),
    "explain": ("learn more: multihead explain {topic}", "详细讲解：multihead explain {topic}"),
    "conventions": ("Conventions found", "检测到的约定"),
    "roles": ("Roles of its Linear layers", "各线性层的角色"),
    "no-out": ("(none: heads are concatenated)", "（无：各头直接拼接）"),
    "after-rename-pass": ("with '{method}' renamed to forward, it matches the reference",
                          "把 '{method}' 改名为 forward 后，它与参考实现一致"),
    "after-rename-bug": ("with '{method}' renamed to forward, it still has a bug: {bug}",
                         "把 '{method}' 改名为 forward 后，仍有错误：{bug}"),
    "after-rename": ("with '{method}' used as forward, the rest of the check says: {verdict}",
                     "把 '{method}' 当作 forward 后，其余检查结果：{verdict}"),
    "random": ("two identical calls in eval mode give different outputs: is dropout applied with "
               "training=True (F.dropout(x, p) defaults to it)? Use nn.Dropout or pass training=self.training",
               "eval 模式下两次相同的调用得到不同输出：是否用了 training=True 的 dropout（F.dropout(x, p) "
               "默认如此）？请用 nn.Dropout，或传入 training=self.training"),
    "no-roles": ("could not tell which layers project queries, keys and values. What each projection read "
                 "(x/q/k/v: an input, mid: an intermediate tensor, -: never called): {seen}. Projections it "
                 "recognises: nn.Linear, GPT-2-style Conv1D (x @ W + b), nn.MultiheadAttention inside the "
                 "module; raw nn.Parameter matrices are not",
                 "无法判断哪些层分别投影查询、键和值。各投影层读到的内容（x/q/k/v：输入，mid：中间张量，-：没有被调用）："
                 "{seen}。能识别的投影层有：nn.Linear、GPT-2 风格的 Conv1D（x @ W + b）、模块内部的 "
                 "nn.MultiheadAttention；直接用 nn.Parameter 矩阵做投影的写法无法识别"),
    "internal": ("the checker cannot handle this module ({error})", "检查器无法处理这个模块（{error}）"),
    "layout-guess": ("batch elements influence each other, so the layout was chosen by which one fits "
                     "the outputs best", "批量中的样本相互影响，因此按哪种排列最符合输出来选择布局"),
    "mask-required": ("it raised when called without a mask ({param}=None), which the checker does to compare "
                      "unmasked outputs: let None mean no mask (`if {param} is not None:`)",
                      "不带掩码调用时（{param}=None）它报错了，而检查器需要这样调用来比较不加掩码的输出："
                      "请让 None 表示不加掩码（`if {param} is not None:`）"),
    "mask-unverified": ("its mask argument '{param}' could not be verified: under none of the conventions tried "
                        "({tried}) do blocked keys stop mattering, and no known mistake explains the masked "
                        "outputs", "无法验证掩码参数 '{param}'：试过的各种约定（{tried}）都没能让被屏蔽的键不起作用，"
                        "已知的错误也解释不了带掩码时的输出"),
    "scale-measured": ("measured scale of the scores: {measured:.6g} (1/sqrt(head_dim) = {right:.6g})",
                       "实测的分数缩放因子：{measured:.6g}（1/sqrt(head_dim) = {right:.6g}）"),
    "scale-rebuilt": ("at this head count {bugs} give the same scale; rebuilt with {heads} heads, the module "
                      "shows {bug}", "在这个头数下 {bugs} 的缩放因子相同；改用 {heads} 个头重新构建后，它表现为 {bug}"),
    "scale-ambiguous": ("at this head count these mistakes give the same scale: {bugs}; build it with another "
                        "number of heads (--init) to tell them apart", "在这个头数下这些错误的缩放因子相同：{bugs}；"
                        "请用 --init 换一个头数来区分"),
    "config-read": ("built with a config object; the attributes its constructor read: {values}",
                    "用配置对象构造；构造函数读取的属性：{values}"),
    "switched-on": ("built with {name}=True: its default is False, and a model built from this class turns "
                    "it on (pass --init to choose)", "构造时使用了 {name}=True：它的默认值是 False，而用这个类搭建"
                    "的模型会打开它（可用 --init 指定）"),
    "also-scale": ("and a second mistake: the scores are scaled by {measured:.6g}, not 1/sqrt(head_dim) = {right:.6g} "
                   "({bug})", "还有第二个错误：分数的缩放因子是 {measured:.6g}，而不是 1/sqrt(head_dim) = {right:.6g}（{bug}）"),
    "named-without-mask": ("named from the outputs without a mask: with a mask they differ from this variant too "
                           "(a causal fill and a mask fill that are not the same number?)",
                           "依据不带掩码的输出判断：带掩码时输出与这个变体也不一致（因果屏蔽和掩码用的填充值不同？）"),
    "printed": ("its forward prints; that output was hidden during the check",
                "它的 forward 会打印内容；检查期间这些输出已被隐藏"),
}


def say(key: str, lang: str = "en", **values) -> str:
    """The message ``key`` in ``lang``, formatted with ``values``."""
    for table in (MESSAGES, CONVENTION_TEXT, BUG_TEXT, MASK_TEXT, ROLE_TEXT):
        if key in table:
            return table[key][LANGS.index(lang)].format(**values)
    raise KeyError(key)


def check_lang(lang: str) -> str:
    """``lang`` if supported; otherwise an AttentionError listing the choices."""
    if lang not in LANGS:
        raise AttentionError(f"lang must be one of {', '.join(LANGS)}, got {lang!r}")
    return lang
