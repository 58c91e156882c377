"""What each catalogued bug is, in English and Chinese: its short name and one line on what the code does
wrong and what it should do. `multihead.checker.bugs.sentences` holds every other sentence and looks these up too."""

from __future__ import annotations

LANGS = ("en", "zh")

# bug id -> (English, Chinese): the bug's short name, shown with its id in parentheses
BUG_TITLE = {
    "reshape-without-transpose": ("heads split without a transpose", "拆分多头时缺少 transpose"),
    "merge-without-transpose": ("heads merged without a transpose", "合并多头时缺少 transpose"),
    "softmax-wrong-axis": ("softmax over the wrong axis", "softmax 的维度不对"),
    "missing-scale": ("scores not scaled", "注意力分数没有缩放"),
    "scale-by-embed-dim": ("scaled by the model width, not the head size", "按模型宽度而不是单头维度缩放"),
    "scale-halved": ("half the right scale", "缩放因子只有应有值的一半"),
    "scale-by-head-dim": ("divided by head_dim, not its square root", "除以了 head_dim 而不是它的平方根"),
    "wrong-scale": ("wrong scale", "缩放因子不对"),
    "scale-after-softmax": ("scaled after the softmax", "在 softmax 之后才缩放"),
    "mask-after-softmax": ("mask applied after the softmax", "在 softmax 之后才加掩码"),
    "mask-filled-with-zero": ("blocked scores filled with 0", "被屏蔽的分数填成了 0"),
    "mask-wrong-rows": ("mask sent to the wrong batch rows", "掩码作用到了错误的批次行"),
    "no-output-projection": ("output projection never applied", "没有使用输出投影层"),
    "causal-off-by-one": ("causal mask off by one", "因果掩码错了一位"),
    "causal-mask-unused": ("causal mask built but never applied", "构造了因果掩码，却没有用上"),
    "causal-mask-reversed": ("causal mask reversed (triu where tril was meant)", "因果掩码方向反了（该用 tril 却用了 triu）"),
    "keys-used-as-values": ("weights multiply the keys, not the values", "注意力权重乘的是键而不是值"),
    "scores-without-key-transpose": ("scores without transposing the keys", "计算分数时没有转置 K"),
    "view-on-non-contiguous": ("view() on a non-contiguous tensor", "在内存不连续的张量上调用 view()"),
    "forward-misspelled": ("forward misspelled", "forward 方法名拼错了"),
    "mask-ignored": ("mask has no effect", "掩码没有起作用"),
    "mask-sign-flipped": ("mask added with the wrong sign", "掩码加到分数上时符号反了"),
    "kv-heads-tiled": ("key/value heads tiled, not grouped", "键/值头按整体平铺复制，而不是按组复制"),
    "rope-half-split-on-interleaved": ("half-split RoPE turn on interleaved cos/sin",
                                       "cos/sin 按相邻成对排列，却用了前后两半配对的旋转"),
    "rope-interleaved-on-half-split": ("interleaved RoPE turn on half-split cos/sin",
                                       "cos/sin 按前后两半排列，却用了相邻成对的旋转"),
    "cache-positions-not-offset": ("positions not offset by the cache length", "位置没有加上缓存长度"),
    "cache-causal-top-left": ("causal mask aligned top-left in a cached step", "缓存解码时因果掩码按左上角对齐"),
    "mla-absorbed-wuk-transposed": ("W_UK transposed when absorbed into the query",
                                    "把 W_UK 吸收进查询时用成了它的转置"),
    "mask-inverted": ("mask read the wrong way round", "掩码的含义读反了"),
    "window-off-by-one": ("sliding window off by one", "滑动窗口差了一位"),
    "qk-norm-wrong-axis": ("QK-norm over the whole width, not each head", "QK-norm 在整个宽度上归一化，而不是在每个头内"),
    "rope-partial-wrong-features": ("partial RoPE turns the wrong features", "部分 RoPE 旋转了不该旋转的特征"),
    "sparse-none-unmasked": ("-1 slots attended as real keys", "把 -1 空位当成了真实的键"),
    "topk-wrong-axis": ("top-k over the wrong axis", "top-k 取错了维度"),
}


def bug_name(bug_id: str, lang: str) -> str:
    """The bug's short name with its id: ``heads split without a transpose (reshape-without-transpose)``."""
    title = BUG_TITLE[bug_id][LANGS.index(lang)]
    return f"{title}（{bug_id}）" if lang == "zh" else f"{title} ({bug_id})"


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
        "分数除以了 sqrt(embed_dim)；缩放因子应是 1 / sqrt(head_dim)，其中 head_dim 是单个头的维度。"),
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
    "causal-mask-unused": (
        "The code builds a causal mask, but the scores never go through it: every token also attends to the "
        "tokens after it. Hand the mask to the attention call, or keep what masked_fill returns "
        "(scores = scores.masked_fill(...)).",
        "代码构造了因果掩码，但注意力分数根本没有用上它，所以每个词也能看到排在它后面的词。"
        "应当把掩码传给注意力函数，或者把 masked_fill 的返回值赋回去（scores = scores.masked_fill(...)）。"),
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
    "causal-mask-reversed": (
        "Each query sees itself and the tokens after it, never the ones before: the causal mask keeps the upper "
        "triangle. torch.triu(ones(L, L)) marks the keys j >= i; a causal mask keeps j <= i: build it with "
        "torch.tril(ones(L, L)) (1 = keep) and masked_fill(mask == 0, -inf), or mark the blocked keys with "
        "torch.triu(ones(L, L, dtype=bool), diagonal=1) and masked_fill(mask, -inf).",
        "每个查询只看到自己和后面的词，看不到前面的词：因果掩码保留的是上三角。torch.triu(ones(L, L)) 标出的是 j >= i "
        "的键，而因果掩码应保留 j <= i：用 torch.tril(ones(L, L))（1 表示保留）再 masked_fill(mask == 0, -inf)；"
        "或者用 torch.triu(ones(L, L, dtype=bool), diagonal=1) 标出要屏蔽的键，再 masked_fill(mask, -inf)。"),
    "mask-sign-flipped": (
        "The mask is added to the scores with the wrong sign: a large positive number (such as {param} * 1e9, or "
        "(1 - {param}) * 1e4) lifts the keys it marks instead of pushing the blocked ones down. The outputs only come "
        "out right when the caller passes the reverse mask, so that the lifted keys are the kept ones, and even then "
        "every kept score is shifted by that number, which float32 rounds away. Add a large negative number to the "
        "blocked scores: scores + {param} * -1e9 when 1 = blocked, scores + (1 - {param}) * -1e9 when 1 = keep; "
        "or use masked_fill.",
        "掩码加到分数上时符号反了：加上的是一个很大的正数（比如 {param} * 1e9，或 (1 - {param}) * 1e4），"
        "它把掩码标出的键抬高了，而不是把被屏蔽的键压低。只有调用者反过来传掩码、让被抬高的恰好是要保留的键时，"
        "输出才是对的；即便如此，每个保留的分数都被加上了这个大数，在 float32 下分数本身的差别会被舍入掉。"
        "应该给被屏蔽的分数加一个很大的负数：1 表示屏蔽时写 scores + {param} * -1e9，"
        "1 表示保留时写 scores + (1 - {param}) * -1e9；或者直接用 masked_fill。"),
    "mask-inverted": (
        "The mask is read the wrong way round: the code blocks the keys where '{param}' is {blocked}, but the caller's "
        "mask (--call mask={claim}) marks the keys to block with {wanted}. Block where it is {wanted}: "
        "masked_fill({param} == {wanted}, float('-inf')).",
        "掩码的含义读反了：代码屏蔽的是 '{param}' 为 {blocked} 的键，而调用者传入的掩码（--call mask={claim}）"
        "用 {wanted} 标出要屏蔽的键。应该屏蔽值为 {wanted} 的位置：masked_fill({param} == {wanted}, float('-inf'))。"),
    "window-off-by-one": (
        "The sliding window lets each query see {got} keys, not the {want} it was built with ({name}={want}): query i "
        "must see keys i - {want} + 1 to i, itself included. Keep key j when 0 <= i - j < {name}, and block it when "
        "i - j >= {name}.",
        "滑动窗口让每个查询看到 {got} 个键，而不是构造时给定的 {want} 个（{name}={want}）：第 i 个查询应该看到"
        "第 i - {want} + 1 到第 i 个键，包括它自己。满足 0 <= i - j < {name} 的键 j 保留，i - j >= {name} 的屏蔽。"),
    "qk-norm-wrong-axis": (
        "q and k are normalised (RMSNorm) over all heads together, the full width H*D, before the heads are split: "
        "each head's scale then depends on the other heads. QK-norm normalises each head's q and k over its own "
        "head_dim features (Qwen3, Gemma 3): split the heads first, then apply RMSNorm(head_dim). (OLMo 2 normalises "
        "the full width on purpose: if that is the model you are porting, this is its design, not a bug.)",
        "q 和 k 是在拆分多头之前、在整个宽度 H*D 上一起做的归一化（RMSNorm），这样每个头的尺度都会受其他头影响。"
        "QK-norm 应该让每个头的 q 和 k 各自在自己的 head_dim 个特征上归一化（Qwen3、Gemma 3 都是这样）："
        "先拆分多头，再用 RMSNorm(head_dim)。（OLMo 2 是有意在整个宽度上归一化的；如果你移植的正是 OLMo 2，"
        "这是它的设计，不是错误。）"),
    "rope-partial-wrong-features": (
        "Under partial RoPE only the first rotary_dim = {want} features of each head turn (GPT-NeoX, Phi), "
        "and the rest pass through unchanged; this module turns features {turned} of each head of {dim}. Turn "
        "x[..., :rotary_dim] and concatenate x[..., rotary_dim:] back unchanged.",
        "部分 RoPE 只旋转每个头的前 rotary_dim = {want} 个特征（GPT-NeoX、Phi），其余特征原样保留；"
        "而这个模块旋转的是每个头（共 {dim} 个特征）的第 {turned} 个特征。应只旋转 x[..., :rotary_dim]，"
        "再把 x[..., rotary_dim:] 原样拼接回去。"),
    "kv-heads-tiled": (
        "The key/value heads are copied with repeat (kv head j serves query heads j, j + Hkv, ...); each kv head "
        "belongs to a group of neighbouring query heads: repeat_interleave(H // Hkv, dim=1), so query head h "
        "reads kv head h // (H // Hkv).",
        "键/值头是用 repeat 复制的（第 j 个键/值头被分给了第 j、j + Hkv……个查询头）；"
        "而每个键/值头应属于一组相邻的查询头：应写 repeat_interleave(H // Hkv, dim=1)，"
        "让第 h 个查询头读取第 h // (H // Hkv) 个键/值头。"),
    "rope-half-split-on-interleaved": (
        "RoPE pairs the wrong features. The cos/sin tables repeat each frequency on neighbouring features "
        "(repeat_interleave(freqs, 2): pairs (0, 1), (2, 3), ...), but the turn is rotate_half, which pairs "
        "feature i with i + D/2. The result is not a rotation: scores no longer depend on the distance alone. "
        "Use one layout for both: cat((freqs, freqs), -1) with rotate_half (GPT-NeoX, Llama), or the "
        "interleaved tables with the pairwise turn (-x[1::2], x[0::2]) (GPT-J, Meta's complex form), whichever "
        "the checkpoint was trained with.",
        "RoPE 配错了特征对。cos/sin 表把每个频率放在相邻的两个特征上（repeat_interleave(freqs, 2)，"
        "即 (0, 1)、(2, 3)……成对），旋转却用了 rotate_half，它把第 i 个特征和第 i + D/2 个配成一对。"
        "这样算出来的已经不是旋转，分数也就不再只取决于两个位置的距离。两处要用同一种排列："
        "要么 cat((freqs, freqs), -1) 配 rotate_half（GPT-NeoX、Llama 的写法），"
        "要么相邻成对的表配逐对旋转 (-x[1::2], x[0::2])（GPT-J、Meta 复数写法），以模型训练时用的那种为准。"),
    "rope-interleaved-on-half-split": (
        "RoPE pairs the wrong features. The cos/sin tables are half-split (cat((freqs, freqs), -1): feature i "
        "shares its frequency with i + D/2), but the turn pairs neighbours ((-x[1::2], x[0::2]), the "
        "interleaved layout). The result is not a rotation: scores no longer depend on the distance alone. "
        "Use one layout for both: the half-split tables with rotate_half (GPT-NeoX, Llama), or "
        "repeat_interleave(freqs, 2) with the pairwise turn (GPT-J), whichever the checkpoint was trained with.",
        "RoPE 配错了特征对。cos/sin 表是前后两半排列的（cat((freqs, freqs), -1)，第 i 个特征和第 i + D/2 个"
        "共用一个频率），旋转却把相邻的两个特征配成一对（(-x[1::2], x[0::2])，即交错排列）。"
        "这样算出来的已经不是旋转，分数也就不再只取决于两个位置的距离。两处要用同一种排列："
        "要么前后两半的表配 rotate_half（GPT-NeoX、Llama 的写法），"
        "要么 repeat_interleave(freqs, 2) 配逐对旋转（GPT-J 的写法），以模型训练时用的那种为准。"),
    "cache-positions-not-offset": (
        "With the cache, every call starts its positions at 0: the new token is turned as if it were the first "
        "one (off by the prompt). Its position is the number of tokens already cached: "
        "positions = torch.arange(past_len, past_len + L), where past_len is the cache's length before this call.",
        "用缓存时，每次调用的位置都从 0 开始，新词被当成第一个词来旋转（差了整个提示的长度）。"
        "新词的位置应是缓存里已有的词数：positions = torch.arange(past_len, past_len + L)，"
        "其中 past_len 是这次调用之前缓存的长度。"),
    "cache-causal-top-left": (
        "In a cached step the causal mask is aligned top-left (torch.ones(Lq, Lk).tril()): with one new query "
        "and Lk cached keys it sees only key 0. The new queries are the last Lq positions, so align it "
        "bottom-right: tril(Lk - Lq), i.e. query i sees keys j <= i + Lk - Lq.",
        "缓存解码的一步里，因果掩码是按左上角对齐的（torch.ones(Lq, Lk).tril()）：只有一个新查询、"
        "缓存里有 Lk 个键时，它只能看到第 0 个键。新的查询是最后 Lq 个位置，掩码应按右下角对齐："
        "写成 tril(Lk - Lq)，也就是第 i 个查询能看到 j <= i + Lk - Lq 的键。"),
    "mla-absorbed-wuk-transposed": (
        "The absorbed path folds each head's W_UK into the query transposed: q_nope @ W_UK_h.T instead of "
        "q_nope @ W_UK_h. Since k_nope = W_UK_h c (W_UK_h is (Dn, C), W_UK.weight.view(H, Dn, C)[h]), "
        "q_nope · k_nope = (q_nope @ W_UK_h) · c: the query that meets the latent c is q_nope @ W_UK_h, "
        "(Dn,) @ (Dn, C) -> (C,), e.g. einsum(\"bhtd,hdc->bhtc\", q_nope, w_uk). The transpose only runs "
        "because Dn == C here, so no shape error catches it; with real sizes (Dn 128, C 512) it raises. "
        "Check it as the report did: the naive and absorbed forms must give the same outputs.",
        "吸收形式把每个头的 W_UK 并入查询时用成了转置：写成了 q_nope @ W_UK_h.T，应为 q_nope @ W_UK_h。"
        "因为 k_nope = W_UK_h c（W_UK_h 的形状是 (Dn, C)，即 W_UK.weight.view(H, Dn, C)[h]），"
        "所以 q_nope · k_nope = (q_nope @ W_UK_h) · c：与潜向量 c 做点积的查询是 q_nope @ W_UK_h，"
        "形状为 (Dn,) @ (Dn, C) -> (C,)，例如 einsum(\"bhtd,hdc->bhtc\", q_nope, w_uk)。"
        "这里之所以没有报形状错误，只是因为恰好 Dn == C；换成真实的尺寸（Dn 为 128，C 为 512）就会直接报错。"
        "可以像这份报告一样自己验证：朴素形式和吸收形式的输出必须相同。"),
    "sparse-none-unmasked": (
        "The -1 slots are attended as keys: indexing with -1 (k[..., indices, :]) reads the last key, and "
        "clamping to 0 without masking reads key 0, so every query with a free slot also attends to a key "
        "nobody picked (in causal lists the last key is a future token). -1 means no key: gather with "
        "indices.clamp(min=0), then fill the scores of the slots where indices < 0 with -inf before the softmax "
        "(or leave those slots out when building a dense mask).",
        "把 -1 空位当成了真实的键：直接用 -1 做下标（k[..., indices, :]）取到的是最后一个键，clamp 到 0 之后"
        "又不加屏蔽，取到的就是第 0 个键；于是每个带空位的查询都多关注了一个谁也没选的键（在因果的列表里，"
        "最后一个键还是未来的词）。-1 的意思是“没有键”：可以先用 indices.clamp(min=0) 取出键，再在 softmax "
        "之前把 indices < 0 那些位置的分数填成 -inf（如果是构造稠密掩码，就直接跳过这些空位）。"),
    "topk-wrong-axis": (
        "top-k runs over the wrong axis: the scores are (B, Lq, Lk) and each query keeps its K best keys, so take "
        "topk(k, dim=-1). With dim=1 (or -2) you get, for each key, the queries that score it highest, and dim=0 "
        "compares batch rows: neither is a list of keys.",
        "top-k 取错了维度：分数的形状是 (B, Lq, Lk)，每个查询要留下得分最高的 K 个键，所以应该在最后一维上取："
        "topk(k, dim=-1)。用 dim=1（或 -2）得到的是每个键得分最高的几个查询，用 dim=0 则是在批次之间比较，"
        "两者都不是键的列表。"),
    "mask-ignored": (
        "The mask has no effect on the output. masked_fill returns a new tensor: assign it "
        "(scores = scores.masked_fill(...)) or use the in-place masked_fill_.",
        "掩码对输出没有任何影响。masked_fill 会返回一个新张量：要把结果赋值回去"
        "（scores = scores.masked_fill(...)），或者使用原地操作 masked_fill_。"),
}
