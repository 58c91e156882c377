"""Every sentence the checker says, in English and Chinese (``lang="en"`` or ``"zh"``)."""

from __future__ import annotations

from multihead.checker.bugs.bug_words import BUG_TEXT, BUG_TITLE, LANGS, bug_name  # noqa: F401 (re-exported)
from multihead.checker.core.stage_words import STAGE_TEXT
from multihead.errors import AttentionError

# convention key -> (English, Chinese)
CONVENTION_TEXT = {
    "inputs:x": ("{call}({args}): self-attention on one input", "{call}({args})：只有一个输入的自注意力"),
    "inputs:qkv": ("{call}({args}): separate query, key, value", "{call}({args})：查询、键、值分别传入"),
    "inputs:q_kv": ("{call}({args}): query, and one tensor for keys and values",
                    "{call}({args})：传入查询，键和值共用另一个输入"),
    "function:core": ("{call}({args}): an attention function, taking q, k, v as {shape}; checked inside multi-head "
                      "attention whose projections the checker supplies", "{call}({args})：一个注意力函数，q、k、v 的形状为 "
                      "{shape}；检查时由检查器在它外面补上各个投影层，组成多头注意力"),
    "function:sparse": ("{call}({args}): sparse attention, q (B, H, Lq, D), k and v (B, H, Lk, D), '{indices}' "
                        "(B, Lq, K) the keys each query may see; compared with mh.attention(q, k, v, "
                        "mh.Mask.sparse({indices})) on causal lists and on 3 queries over 10 keys",
                        "{call}({args})：稀疏注意力，q 的形状为 (B, H, Lq, D)，k 和 v 为 (B, H, Lk, D)，'{indices}' 为 "
                        "(B, Lq, K)，列出每个查询能看到的键；在因果的索引列表上、以及 3 个查询对 10 个键的情形下，"
                        "与 mh.attention(q, k, v, mh.Mask.sparse({indices})) 比较"),
    "sparse:kv-shared": ("one key/value head shared by every query head (k and v (B, 1, Lk, D), as in DeepSeek "
                         "V3.2's absorbed attention): matches too", "所有查询头共用一个键/值头（k 和 v 的形状为 "
                         "(B, 1, Lk, D)，和 DeepSeek V3.2 吸收形式的注意力一样）：结果同样一致"),
    "sparse:kv-heads-equal": ("needs as many key/value heads as query heads: with one shared key/value head "
                              "(k and v (B, 1, Lk, D)) it raises", "键/值头的数目必须与查询头相同：只给一个共用的"
                              "键/值头（k 和 v 的形状为 (B, 1, Lk, D)）时会报错"),
    "topk:marks-blocked": ("on causal scores (-inf after each query) the slots it cannot fill are -1",
                           "在因果的分数上（每个查询之后的键为 -inf），填不满的位置都是 -1"),
    "function:topk": ("{call}({args}): top-k selection, index scores (B, Lq, Lk) -> each query's K best keys "
                      "(B, Lq, K), in any order; compared with scores.topk(K, dim=-1).indices",
                      "{call}({args})：top-k 选键，由索引分数 (B, Lq, Lk) 得到每个查询得分最高的 K 个键 (B, Lq, K)，"
                      "顺序不限；与 scores.topk(K, dim=-1).indices 比较"),
    "order:qkv": ("arguments told apart by behaviour: query '{q}', key '{k}', value '{v}'",
                  "根据行为判断出各参数的角色：查询是 '{q}'，键是 '{k}'，值是 '{v}'"),
    "order:q_kv": ("arguments told apart by behaviour: query '{q}', keys and values '{k}'",
                   "根据行为判断出各参数的角色：查询是 '{q}'，键和值都来自 '{k}'"),
    "pre": ("its projections read the output of '{name}' ({kind}, inside the module): the attention is "
            "checked on that", "它的投影层读取的是模块内部 '{name}'（{kind}）的输出，所以注意力按这个输出来检查"),
    "filled:start": ("{name} = 0: the call is a whole prompt, from the first position",
                     "{name} = 0：每次调用都是从第一个位置开始的完整输入"),
    "filled:positions": ("{name} = 0, 1, ..., L-1 (shape (1, L))", "{name} = 0, 1, ..., L-1（形状为 (1, L)）"),
    "filled:table": ("{name} = a complex RoPE table (L, {half}): position t turns pair i by t * 10000^(-2i/{size})",
                     "{name} = 复数形式的 RoPE 表 (L, {half})：第 t 个位置的第 i 对特征转过 t * 10000^(-2i/{size}) 弧度"),
    "filled:cos": ("{name} = cos of the RoPE angles, (L, {size}), the halves repeated (i, i + {half})",
                   "{name} = RoPE 角度的余弦，形状为 (L, {size})，前后两半相同 (i, i + {half})"),
    "filled:sin": ("{name} = sin of the RoPE angles, (L, {size}), the halves repeated (i, i + {half})",
                   "{name} = RoPE 角度的正弦，形状为 (L, {size})，前后两半相同 (i, i + {half})"),
    "filled:cos_sin": ("{name} = (cos, sin), each (1, L, {size}), the halves repeated (i, i + {half})",
                       "{name} = (cos, sin)，形状都是 (1, L, {size})，前后两半相同 (i, i + {half})"),
    "filled:sinusoidal": ("{name} = RoFormer's sinusoidal table (1, 1, L, {size}): [sin | cos] of t * 10000^(-2i/{size})",
                          "{name} = RoFormer 的正弦位置表 (1, 1, L, {size})：t * 10000^(-2i/{size}) 的 [sin | cos]"),
    "layout:batch": ("batch first (B, L, E)", "批量维在前 (B, L, E)"),
    "layout:seq": ("sequence first (L, B, E)", "序列维在前 (L, B, E)"),
    "causal:yes": ("causal inside the module (it masks future tokens)", "模块内部带因果掩码（屏蔽后面的词）"),
    "causal:yes-buffer": ("causal inside the module (it masks future tokens; buffer '{buffer}')",
                          "模块内部带因果掩码（屏蔽后面的词；缓冲区 '{buffer}'）"),
    "causal:no": ("not causal", "不带因果掩码"),
    "causal:built": ("causal through a mask its forward builds", "带因果掩码（在 forward 里构造）"),
    "causal:built-after-softmax": ("causal through a mask its forward builds, applied after the softmax",
                                   "在 forward 里构造了因果掩码，但放在了 softmax 之后"),
    "causal:after-softmax": ("causal through buffer '{buffer}', applied after the softmax",
                             "通过缓冲区 '{buffer}' 实现因果屏蔽，但放在了 softmax 之后"),
    "mask:none": ("no mask argument", "没有掩码参数"),
    "mask:ignored": ("mask argument '{param}': has no effect on the outputs",
                     "掩码参数 '{param}'：对输出没有任何影响"),
    "mask:unknown": ("mask argument '{param}': convention not recognised, compared without masks",
                     "掩码参数 '{param}'：无法识别它的约定，因此只比较了不带掩码的情况"),
    "mask:unconfirmed": ("mask argument '{param}': convention not confirmed (check again once the bug is fixed)",
                         "掩码参数 '{param}'：约定尚未确认（改好上面的错误后再检查一次）"),
    "mask-complete": ("with a mask, its own causal masking is off: the mask it is given is the complete mask "
                      "(as in Hugging Face layers)", "传入掩码时，它自己的因果屏蔽会关闭：传进来的掩码就是完整的掩码"
                      "（和 Hugging Face 的层一样）"),
    "cross-lengths": ("Lq != Lk accepted", "查询和键的长度可以不同（Lq != Lk）"),
    "cross-lengths:equal": ("needs Lq == Lk (compared with equal lengths)",
                            "要求查询和键等长（Lq == Lk），因此只用等长的输入比较"),
    "heads": ("{heads} heads of size {head_dim}", "{heads} 个头，每个头 {head_dim} 维"),
    "kv-heads": ("key/value heads: {kv_heads}, each shared by a group of query heads (GQA)",
                 "键/值头有 {kv_heads} 个，每个由一组查询头共享（GQA）"),
    "dtype:float32": ("runs in float32 only (compared in float32)", "只能在 float32 下运行（因此按 float32 比较）"),
    "rope:half": ("RoPE on q and k, half-split pairs (i, i + D/2), base {base}",
                  "对 q 和 k 施加了 RoPE，按前后两半配对 (i, i + D/2)，基数 base 为 {base}"),
    "rope:interleaved": ("RoPE on q and k, interleaved pairs (2i, 2i + 1), base {base}",
                         "对 q 和 k 施加了 RoPE，按相邻两个配对 (2i, 2i + 1)，基数 base 为 {base}"),
    "cache": ("KV cache driven through {protocol}: a prompt of {prompt} tokens, then {steps} single steps, "
              "compared with the full forward", "通过 {protocol} 使用 KV 缓存：先输入 {prompt} 个词的提示，"
              "再逐个输入 {steps} 个词，与一次性完整前向的结果比较"),
    "mla": ("multi-head latent attention: {heads} heads of [{nope} + {rope} rotary] features for queries and keys, "
            "{value} for values, a latent of {latent}; absorbed path {path}, compared with the naive forward",
            "多头潜在注意力：{heads} 个头，查询和键每头 {nope} 维再加 {rope} 维旋转部分，值每头 {value} 维，"
            "潜向量 {latent} 维；吸收形式通过 {path} 调用，与朴素前向的结果比较"),
    "mla-naive": ("multi-head latent attention: {heads} heads of [{nope} + {rope} rotary] features for queries and "
                  "keys, {value} for values, a latent of {latent}; it has no absorbed path (a forward flag such as "
                  "absorb=True, or a forward_absorbed method), so its forward alone is compared",
                  "多头潜在注意力：{heads} 个头，查询和键每头 {nope} 维再加 {rope} 维旋转部分，值每头 {value} 维，"
                  "潜向量 {latent} 维；模块没有吸收形式（例如前向参数 absorb=True 或 forward_absorbed 方法），"
                  "因此只比较它的前向"),
    "mla-q-latent": ("low-rank queries: x is first pressed into a query latent of {q_latent} features, and every "
                     "head's query comes out of it", "低秩查询：x 先被压缩成 {q_latent} 维的查询潜向量，"
                     "每个头的查询再由它生成"),
    "mla-rope:half": ("RoPE on the rotary parts of q and k only (decoupled), half-split pairs (i, i + R/2), "
                      "base {base}", "只对 q 和 k 的旋转部分施加 RoPE（解耦），按前后两半配对 (i, i + R/2)，基数 base 为 {base}"),
    "mla-rope:interleaved": ("RoPE on the rotary parts of q and k only (decoupled), interleaved pairs (2i, 2i + 1), "
                             "base {base}", "只对 q 和 k 的旋转部分施加 RoPE（解耦），按相邻两个配对 (2i, 2i + 1)，"
                             "基数 base 为 {base}"),
    "window": ("sliding window: each query sees the last {window} keys, itself included",
               "滑动窗口：每个查询只看最近的 {window} 个键（包括它自己）"),
    "rope-reversed": ("RoPE turns by -theta (the other way round): scores still depend only on the distance, but "
                      "weights trained with the usual direction would not fit", "RoPE 按 -theta 旋转（方向与常规相反）："
                      "分数仍然只取决于距离，但按常规方向训练出的权重用在这里就对不上了"),
    "rope-partial": ("partial RoPE: only the first {rotary_dim} of each head's {head_dim} features turn",
                     "部分 RoPE：每个头的 {head_dim} 个特征里只有前 {rotary_dim} 个旋转"),
    "qk-norm:width": ("QK-norm over the whole width: q and k go through RMSNorm across all heads at once, before the "
                      "split (eps {eps})", "整个宽度上的 QK-norm：q 和 k 在拆分多头之前，跨所有头一起做 RMSNorm（eps 为 {eps}）"),
    "qk-norm:plain": ("QK-norm: each head's q and k go through RMSNorm over their own features (no weight, eps {eps})",
                      "QK-norm：每个头的 q 和 k 各自在自己的特征上做 RMSNorm（没有权重，eps 为 {eps}）"),
    "qk-norm:plain:weighted": ("QK-norm: each head's q and k go through RMSNorm over their own features (weights "
                               "'{q}' and '{k}', eps {eps})", "QK-norm：每个头的 q 和 k 各自在自己的特征上做 RMSNorm"
                               "（权重为 '{q}' 和 '{k}'，eps 为 {eps}）"),
    "qk-norm:before": ("QK-norm before RoPE: each head's q and k go through RMSNorm over their own features (no weight, "
                       "eps {eps})", "先做 QK-norm 再做 RoPE：每个头的 q 和 k 各自在自己的特征上做 RMSNorm（没有权重，eps 为 {eps}）"),
    "qk-norm:before:weighted": ("QK-norm before RoPE: each head's q and k go through RMSNorm over their own features "
                                "(weights '{q}' and '{k}', eps {eps})", "先做 QK-norm 再做 RoPE：每个头的 q 和 k 各自在"
                                "自己的特征上做 RMSNorm（权重为 '{q}' 和 '{k}'，eps 为 {eps}）"),
    "qk-norm:after": ("QK-norm after RoPE: each head's q and k go through RMSNorm over their own features (no weight, "
                      "eps {eps})", "先做 RoPE 再做 QK-norm：每个头的 q 和 k 各自在自己的特征上做 RMSNorm（没有权重，eps 为 {eps}）"),
    "qk-norm:after:weighted": ("QK-norm after RoPE: each head's q and k go through RMSNorm over their own features "
                               "(weights '{q}' and '{k}', eps {eps})", "先做 RoPE 再做 QK-norm：每个头的 q 和 k 各自在"
                               "自己的特征上做 RMSNorm（权重为 '{q}' 和 '{k}'，eps 为 {eps}）"),
    "sinks": ("attention sinks: one learned logit per head ('{name}') joins each softmax's denominator",
              "注意力 sink：每个头有一个可学习的 logit（'{name}'），加进 softmax 的分母"),
    "softcap": ("scores soft-capped at {cap}: {cap} * tanh(scores / {cap})",
                "分数经过上限为 {cap} 的软截断（softcap）：{cap} * tanh(scores / {cap})"),
    "cache:unused": ("cache argument ({protocol}): not read back (each call attends to its own tokens only), "
                     "so cached decoding was not checked", "缓存参数（{protocol}）：没有被读回（每次调用只关注自己输入的词），"
                     "因此没有检查带缓存的解码"),
}

# mask encoding name -> (English, Chinese)
MASK_TEXT = {
    "keep": ("mask '{param}' {shape}: True/1 = may attend", "掩码 '{param}' {shape}：True 或 1 表示可以关注"),
    "block": ("mask '{param}' {shape}: True/1 = blocked", "掩码 '{param}' {shape}：True 或 1 表示屏蔽"),
    "block01": ("mask '{param}' {shape}: 0/1 floats, 1 = blocked", "掩码 '{param}' {shape}：0/1 浮点数，1 表示屏蔽"),
    "keep-shifted": ("mask '{param}' {shape}: fits only as 1 = may attend, added to the scores times +1e9 (the "
                     "reverse of the usual 1 = blocked)",
                     "掩码 '{param}' {shape}：只有按“1 表示可以关注”来传才对得上；它乘以 +1e9 后加到分数上，"
                     "与常见的“1 表示屏蔽”正好相反"),
    "additive": ("mask '{param}' {shape}: added to the scores, -inf = blocked",
                 "掩码 '{param}' {shape}：加到注意力分数上，-inf 表示屏蔽"),
    "causal-switch": ("mask '{param}': any mask switches causal masking on (its values are not read); checked "
                      "with the causal pattern", "掩码 '{param}'：只要传入掩码就会打开因果屏蔽（掩码的值并不读取），"
                      "因此按因果模式检查"),
    "lengths": ("valid lengths '{param}' {shape}: keys j < len are kept",
                "有效长度 '{param}' {shape}：只保留下标 j < len 的键"),
    "multihead-mask": ("mask '{param}': a multihead Mask (it states its own convention)",
                       "掩码 '{param}'：multihead 的 Mask 对象（约定由它自己说明）"),
    "block-shifted": ("mask '{param}' {shape}: fits only as 1 = blocked, with a large number added to every kept score",
                      "掩码 '{param}' {shape}：只有按“1 表示屏蔽”来传才对得上，而且每个保留的分数都被加上了一个很大的数"),
}

# mask encoding name -> (English, Chinese): what a PASS says first about the mask, for a caller
MEANING_TEXT = {
    "meaning:keep": ("your mask '{param}': 1 (True) = may attend, 0 = blocked. A caller who passes 1 = blocked (a "
                     "padding mask) gets wrong results; if you meant 1 = blocked, check again with --call mask=block.",
                     "你的掩码 '{param}'：1（True）表示可以关注，0 表示屏蔽。调用者如果传入 1 表示屏蔽的掩码（例如填充掩码），"
                     "结果就会出错；如果你本来就打算让 1 表示屏蔽，请加上 --call mask=block 再检查一次。"),
    "meaning:block": ("your mask '{param}': 1 (True) = blocked. A caller who passes 1 = keep (such as Hugging Face's "
                      "attention_mask) gets wrong results; if you meant 1 = keep, check again with --call mask=keep.",
                      "你的掩码 '{param}'：1（True）表示屏蔽。调用者如果传入 1 表示保留的掩码（例如 Hugging Face 的 "
                      "attention_mask），结果就会出错；如果你本来就打算让 1 表示保留，请加上 --call mask=keep 再检查一次。"),
    "meaning:additive": ("your mask '{param}' is added to the scores: 0 = may attend, a large negative number (or -inf) "
                         "= blocked. A caller who passes a 0/1 mask gets wrong results.",
                         "你的掩码 '{param}' 会直接加到注意力分数上：0 表示可以关注，很大的负数（或 -inf）表示屏蔽。"
                         "调用者如果传入 0/1 掩码，结果就会出错。"),
    "meaning:lengths": ("'{param}' holds each sequence's valid length: keys j < length are kept, the rest blocked.",
                        "'{param}' 是每个序列的有效长度：下标 j < 长度 的键保留，其余的屏蔽。"),
    "meaning:claimed": ("your mask '{param}' means what --call mask={claim} says.",
                        "你的掩码 '{param}' 的含义与 --call mask={claim} 所说的一致。"),
    "meaning:complete": ("It is the complete mask: given one, the module drops its own causal masking, so the caller "
                         "must put the causal part in it (Hugging Face models do).",
                         "它是完整的掩码：一旦传入，模块就不再做自己的因果屏蔽，所以调用者要把因果部分也放进掩码里"
                         "（Hugging Face 的模型就是这样做的）。"),
    "meaning:sparse": ("'{indices}' lists, for each query, the keys it may see; -1 is a free slot, no key at all "
                       "(FlashMLA's and vLLM's convention), so a query with fewer than K keys fills its list with -1.",
                       "'{indices}' 为每个查询列出它能看到的键；-1 表示空位，不对应任何键（FlashMLA 和 vLLM 都这样约定），"
                       "所以可选的键不足 K 个的查询，用 -1 把列表填满。"),
    "meaning:topk": ("the indices it returns are key positions along the last axis of the scores: pass them to "
                     "mh.Mask.sparse as (B, Lq, K) lists.",
                     "它返回的下标是分数最后一维上的键位置，可以作为 (B, Lq, K) 的列表直接交给 mh.Mask.sparse。"),
    "claim-differs": ("--call mask={claim} says how callers pass '{param}', but the module reads it another way: {found}",
                      "--call mask={claim} 说明了调用者如何传入 '{param}'，但这个模块的读法不同：{found}"),
    "claim-no-mask": ("--call mask={claim} was given, but forward takes no mask argument", "给了 --call mask={claim}，"
                      "但 forward 没有掩码参数"),
}

ROLE_TEXT = {"q": ("query", "查询"), "k": ("key", "键"), "v": ("value", "值"), "o": ("output", "输出"),
             "latent": ("latent (down-projection)", "潜向量（下投影）"), "rope-key": ("rotary key", "旋转位置键"),
             "rope-query": ("rotary query", "旋转位置查询")}

MESSAGES = {
    "pass": ("PASS: {target} matches multihead.MultiHeadAttention (forward and gradients, max error {error:.1e})",
             "通过：{target} 与 multihead.MultiHeadAttention 一致（前向输出和梯度都一致，最大误差 {error:.1e}）"),
    "pass-latent-naive": ("PASS: {target} is multi-head latent attention done right: its forward matches MLA "
                          "computed from its own weights (forward and gradients, max error {error:.1e})",
                          "通过：{target} 是正确的多头潜在注意力：它的前向与用它自己的权重算出的 MLA 一致"
                          "（前向输出和梯度都一致，最大误差 {error:.1e}）"),
    "pass-latent": ("PASS: {target} is multi-head latent attention done right: its naive forward matches MLA "
                    "computed from its own weights (forward and gradients), and its absorbed path gives the same "
                    "outputs (max error {error:.1e})",
                    "通过：{target} 是正确的多头潜在注意力：朴素前向与用它自己的权重算出的 MLA 一致"
                    "（前向输出和梯度都一致），吸收形式的输出也与之相同（最大误差 {error:.1e}）"),
    "pass-sparse": ("PASS: {target} matches mh.attention with mh.Mask.sparse (forward and gradients, max error "
                    "{error:.1e})", "通过：{target} 与使用 mh.Mask.sparse 的 mh.attention 一致"
                    "（前向输出和梯度都一致，最大误差 {error:.1e}）"),
    "pass-topk": ("PASS: {target} picks each query's top-k keys (the same lists as scores.topk(k, dim=-1))",
                  "通过：{target} 为每个查询选出了得分最高的 k 个键（与 scores.topk(k, dim=-1) 的结果相同）"),
    "topk-differs": ("its lists differ from each query's {count} best keys, and from a top-{count} over any other "
                     "axis", "它给出的列表既不是每个查询得分最高的 {count} 个键，也不是沿其他任何一维取的前 {count} 名"),
    "topk-lists-blocked": ("on causal scores (-inf after each query), the first queries have fewer keys than k, "
                           "and their lists name keys scored -inf, future keys that mh.Mask.sparse would then let "
                           "them see: mark those slots -1 (torch.where(values == -inf, -1, indices))",
                           "在因果的分数上（每个查询之后的键为 -inf），最前面几个查询可选的键不足 k 个，它们的列表里"
                           "就混进了分数为 -inf 的键，也就是未来的键，交给 mh.Mask.sparse 之后它们会被看到："
                           "应把这些位置标成 -1（torch.where(values == -inf, -1, indices)）"),
    "mask-fill-positive": ("masked_fill gives the blocked scores {fill}, a large positive number: after the softmax "
                           "those keys take all the weight instead of none. Keep your masked_fill and its condition, "
                           "and fill with a large negative number: masked_fill(<your condition>, float('-inf')) "
                           "(or -1e9).",
                           "masked_fill 把被屏蔽的分数填成了 {fill}，这是一个很大的正数：softmax 之后这些键会拿走"
                           "全部权重，而不是一点也拿不到。masked_fill 和它的条件都不用改，只要把填充值换成一个很大的负数："
                           "masked_fill(原来的条件, float('-inf'))（或 -1e9）。"),
    "fail-bug": ("FAIL: {target}: {bug}", "未通过：{target}：{bug}"),
    "fail-unknown": ("FAIL: {target} differs from the reference (max error {error:.2e}) in a way the "
                     "catalogue does not know", "未通过：{target} 与参考实现不一致（最大误差 {error:.2e}），"
                     "不属于错误目录里已知的任何一种"),
    "fail-grad": ("FAIL: {target}: outputs match but gradients differ (max error {error:.2e})",
                  "未通过：{target}：输出一致，但梯度不一致（最大误差 {error:.2e}）"),
    "fail-reason": ("FAIL: {target}: {reason}", "未通过：{target}：{reason}"),
    "fail-shape": ("FAIL: {target}: {shape}", "未通过：{target}：输出形状不对：{shape}"),
    "fail-raises": ("FAIL: {target} raises {exception}", "未通过：{target} 运行时抛出异常：{exception}"),
    "error": ("ERROR: could not check {target}: {reason}", "错误：无法检查 {target}：{reason}"),
    "explain": ("learn more: multihead explain {topic}", "详细讲解：multihead explain {topic}"),
    "conventions": ("Conventions found", "检测到的约定"),
    "roles": ("Roles of its Linear layers", "各线性层的角色"),
    "no-out": ("(none: heads are concatenated)", "（无：各头的输出直接拼接）"),
    "after-rename-pass": ("with '{method}' renamed to forward, it matches the reference",
                          "把 '{method}' 改名为 forward 后，它与参考实现一致"),
    "after-rename-bug": ("with '{method}' renamed to forward, it still has a bug: {bug}",
                         "把 '{method}' 改名为 forward 后，仍然有错：{bug}"),
    "after-rename": ("with '{method}' used as forward, the rest of the check says: {verdict}",
                     "把 '{method}' 当作 forward 后，其余的检查结果是：{verdict}"),
    "random": ("two identical calls in eval mode give different outputs: is dropout applied with "
               "training=True (F.dropout(x, p) defaults to it)? Use nn.Dropout or pass training=self.training",
               "在 eval 模式下，两次相同的调用得到了不同的输出：是不是 dropout 用了 training=True"
               "（F.dropout(x, p) 默认就是这样）？请改用 nn.Dropout，或者传入 training=self.training。"),
    "no-roles": ("could not tell which layers project queries, keys and values. What each projection read "
                 "(x/q/k/v: an input, mid: an intermediate tensor, -: never called): {seen}. Projections it "
                 "recognises: nn.Linear or a Linear class of its own (F.linear), GPT-2-style Conv1D (x @ W + b), "
                 "parameters applied with @, matmul or einsum, nn.MultiheadAttention inside the module, Linear "
                 "weights handed to F.multi_head_attention_forward",
                 "无法判断哪些层分别投影查询、键和值。各投影层读到的内容（x/q/k/v 表示输入，mid 表示中间张量，"
                 "- 表示没有被调用）：{seen}。能识别的投影有：nn.Linear 或自己写的 Linear 类（调用 F.linear）、"
                 "GPT-2 风格的 Conv1D（x @ W + b）、用 @、matmul 或 einsum 直接作用的参数矩阵、"
                 "模块内部的 nn.MultiheadAttention，以及交给 F.multi_head_attention_forward 的 Linear 权重。"),
    "internal": ("the checker cannot handle this module ({error})", "检查器无法处理这个模块（{error}）"),
    "layout-guess": ("batch elements influence each other, so the layout was chosen by which one fits "
                     "the outputs best", "批量中的各个样本会相互影响，所以选用了与输出最吻合的那种布局"),
    "mask-required": ("it raised when called without a mask ({param}=None), which the checker does to compare "
                      "unmasked outputs: let None mean no mask (`if {param} is not None:`)",
                      "不传掩码调用时（{param}=None）它报错了，而检查器要这样调用才能比较不加掩码的输出："
                      "请让 None 表示不加掩码（`if {param} is not None:`）。"),
    "raised-at": ("raised at {where}", "出错的代码：{where}"),
    "raises-with-mask": ("it runs without a mask and raises as soon as '{param}' is given one, under every "
                         "mask convention tried", "不传掩码时能运行，但只要给 '{param}' 传入掩码就会报错，"
                         "试过的各种掩码约定都是如此"),
    "did-you-mean": ("tensors have no method '{name}': did you mean '{meant}'?",
                     "张量没有 '{name}' 这个方法：是不是想写 '{meant}'？"),
    "mask-filled-in": ("its mask argument '{param}' is required (it raises on None): every call without a "
                       "mask passed a mask that keeps every key, in the module's own convention",
                       "掩码参数 '{param}' 是必填的（传 None 会报错）：凡是不加掩码的调用，"
                       "都按这个模块自己的约定传入了一个不屏蔽任何键的掩码"),
    "wrong-when-longer": ("it matches the reference on sequences of up to {shorter} tokens but not on {length} "
                          "tokens (max error {error:.2e}): something in it depends on the length (an approximation "
                          "or a window that only starts on long sequences?)",
                          "在不超过 {shorter} 个词的序列上与参考实现一致，到 {length} 个词时就不一致了"
                          "（最大误差 {error:.2e}）：其中有随长度变化的部分（是否有只在长序列上才启用的近似或窗口？）"),
    "mask-unverified": ("its mask argument '{param}' could not be verified: under none of the conventions tried "
                        "({tried}) do blocked keys stop mattering, and no known mistake explains the masked "
                        "outputs", "无法验证掩码参数 '{param}'：试过的各种约定（{tried}）都没能让被屏蔽的键失去作用，"
                        "已知的错误也解释不了带掩码时的输出"),
    "tried": ("keep or block as bool or 0/1, or additive -inf, shaped {shapes}; valid lengths {lengths}",
              "用 bool 或 0/1 表示保留或屏蔽，或者加性的 -inf，形状为 {shapes}；有效长度，形状为 {lengths}"),
    "scale-measured": ("measured scale of the scores: {measured:.6g} (1/sqrt(head_dim) = {right:.6g})",
                       "实测的分数缩放因子：{measured:.6g}（1/sqrt(head_dim) = {right:.6g}）"),
    "scale-same": ("with {heads} heads of size {head_dim}, these mistakes give the same scale:",
                   "在 {heads} 个头、每头 {head_dim} 维的设置下，下面几种错误得到的缩放因子相同："),
    "scale-same-here": ("at this head count, these mistakes give the same scale:",
                        "在这个头数下，下面几种错误得到的缩放因子相同："),
    "scale-rebuilt": ("rebuilt with {heads} heads, only {bug} still fits", "改用 {heads} 个头重新构建后，只有 {bug} 仍然吻合"),
    "scale-ambiguous": ("to tell them apart, build it with another number of heads (--init)",
                        "要区分它们，请用 --init 换一个头数重新构建"),
    "config-read": ("built with a config object; the attributes its constructor read: {values}",
                    "用配置对象构造；构造函数读取了这些属性：{values}"),
    "switched-on": ("built with {name}=True: its default is False, and a model built from this class turns "
                    "it on (pass --init to choose)", "构造时设置了 {name}=True：它的默认值是 False，"
                    "但用这个类搭建的模型会把它打开（可以用 --init 指定）"),
    "causal-mask-built": ("the causal mask is built here: {where}", "构造因果掩码的那一行：{where}"),
    "mla-scale-nope": ("that is 1/sqrt({nope}): the scale counts only the {nope} features of each head without "
                       "RoPE. Queries and keys have {nope} + {rope} features per head, and their dot product sums "
                       "over all of them: scale by 1/sqrt({nope} + {rope}).",
                       "这正是 1/sqrt({nope})：缩放只算了每个头里不带 RoPE 的 {nope} 维。查询和键每头有 {nope} + {rope} 维，"
                       "点积是对全部这些维求和，所以应除以 sqrt({nope} + {rope})。"),
    "also-scale": ("and a second mistake, {bug}: the scores are scaled by {measured:.6g}, not 1/sqrt(head_dim) = "
                   "{right:.6g}", "还有第二个错误，{bug}：分数的缩放因子是 {measured:.6g}，"
                   "而不是 1/sqrt(head_dim) = {right:.6g}"),
    "named-without-mask": ("named from the outputs without a mask: with a mask they differ from this variant too",
                           "这是根据不带掩码的输出判断的：带掩码时，输出与这种错误写法也对不上"),
    "named-without-mask-causal": ("named from the outputs without a mask: with a mask they differ from this variant "
                                  "too (a causal fill and a mask fill that are not the same number?)",
                                  "这是根据不带掩码的输出判断的：带掩码时，输出与这种错误写法也对不上"
                                  "（因果屏蔽和掩码用的填充值是否不一样？）"),
    "cache-raises": ("with its cache ({protocol}: a prompt, then one token at a time) it raises {error} at {where}",
                     "使用缓存时（{protocol}：先输入提示，再逐个输入词）抛出异常 {error}，出错的代码：{where}"),
    "cache-differs": ("with its cache ({protocol}), a prompt of {prompt} tokens then one token at a time gives "
                      "other rows than its full forward, from token {row} on (max error {error:.2e})",
                      "使用缓存时（{protocol}），先输入 {prompt} 个词的提示、再逐个输入词，得到的结果与完整前向不同，"
                      "从第 {row} 个词开始就不一致（最大误差 {error:.2e}）"),
    "mla-naive-differs": ("its naive forward differs from multi-head latent attention computed from its own weights "
                          "(max error {error:.2e}), in every order of its Linears and RoPE pairing tried",
                          "它的朴素前向与用它自己的权重算出的多头潜在注意力不一致（最大误差 {error:.2e}），"
                          "试过了各种线性层的角色顺序和 RoPE 配对方式"),
    "mla-absorbed-differs": ("its naive forward matches multi-head latent attention (max error {naive:.1e}), but its "
                             "absorbed path {path} gives other outputs (max error {error:.2e}), in a way the "
                             "catalogue does not know",
                             "它的朴素前向与多头潜在注意力一致（最大误差 {naive:.1e}），但吸收形式 {path} 的输出不同"
                             "（最大误差 {error:.2e}），不属于错误目录里已知的任何一种"),
    "mla-absorbed-raises": ("its naive forward matches multi-head latent attention; its absorbed path {path} raises",
                            "它的朴素前向与多头潜在注意力一致；吸收形式 {path} 运行时抛出异常"),
    "mla-wuk-evidence": ("evidence: the naive forward matches MLA from its own weights (max error {naive:.1e}); the "
                         "absorbed path {path} differs from it (max error {absorbed:.2e}); with every head's W_UK "
                         "transposed back in a copy of the module, the absorbed path agrees with the naive forward "
                         "(max error {back:.1e})",
                         "依据：朴素前向与用它自己的权重算出的 MLA 一致（最大误差 {naive:.1e}）；吸收形式 {path} "
                         "与它不同（最大误差 {absorbed:.2e}）；在模块的副本里把每个头的 W_UK 转置回来之后，"
                         "吸收形式与朴素前向一致（最大误差 {back:.1e}）"),
    "printed": ("its forward prints; that output was hidden during the check",
                "它的 forward 会打印内容；检查期间这些输出都被隐藏了"),
}


def say(key: str, lang: str = "en", **values) -> str:
    """The message ``key`` in ``lang``, formatted with ``values``."""
    for table in (MESSAGES, CONVENTION_TEXT, BUG_TEXT, MASK_TEXT, MEANING_TEXT, ROLE_TEXT, STAGE_TEXT):
        if key in table:
            return table[key][LANGS.index(lang)].format(**values)
    raise KeyError(key)


def check_lang(lang: str) -> str:
    """``lang`` if supported; otherwise an AttentionError listing the choices."""
    if lang not in LANGS:
        raise AttentionError(f"lang must be one of {', '.join(LANGS)}, got {lang!r}")
    return lang
