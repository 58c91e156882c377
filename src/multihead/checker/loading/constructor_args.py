"""Constructor arguments (and config attributes) the checker fills in by name.

When the learner gives no ``--init`` / ``--config``, ``guess_value("n_embd")`` says what to pass: 16
features, 4 heads of 4, 64 positions (the longest probe), a RoPE base (theta) of 10000, dropout 0, biases on. ``tried_text()`` lists
every name it knows, for the message shown when a name is not among them.
"""

from __future__ import annotations

from multihead.convert.projections import HEAD_COUNT_NAMES
from multihead.convert.rope_bases import DEFAULT_ROPE_BASE, ROPE_BASE_NAMES

EMBED, HEADS, LENGTH = 16, 4, 64  # sizes used when the learner gives none
HEAD_DIM = EMBED // HEADS

QUERY_SIZE_NAMES = ("query_size", "query_dim", "dim_in", "d_in", "in_dim", "input_dim")  # the query input's width
KEY_SIZE_NAMES = ("key_size", "kdim", "context_dim", "kv_dim", "encoder_dim", "cross_attention_dim", "encoder_hidden_size")
VALUE_SIZE_NAMES = ("value_size", "vdim", "context_dim", "kv_dim", "encoder_dim", "cross_attention_dim",
                    "encoder_hidden_size")
EMBED_NAMES = ("d_model", "hidden_size", "embed_dim", "num_hiddens", "dim", "d_embed", "n_embd", "emb_dim",
               "embed_size", "hidden_dim", "hid_dim", "model_dim", "embedding_dim", "dim_out", "d_out", "d",
               "width", "features", "n_embed", "embedding_size", "size", "hidden", "n_hidden", "d_hidden", "emb",
               "embed", "n_state", "nx", "emb_size", "channels", "n_feat", "in_features", "n_units")
HEAD_NAMES = HEAD_COUNT_NAMES
HEAD_DIM_NAMES = ("d_k", "d_v", "dim_head", "head_dim", "d_head", "head_size", "attention_head_size", "d_kv",
                  "kv_channels", "d_qk", "dk", "dv")
LENGTH_NAMES = ("context_length", "block_size", "max_len", "seq_len", "max_seq_len", "n_ctx", "max_length",
                "max_seq_length", "context_size", "max_positions", "seq_length", "n_positions",
                "max_position_embeddings", "max_seq")
WINDOW_NAMES = ("window", "window_size", "sliding_window", "attention_window", "local_window", "window_len",
                "sliding_window_size", "attn_window")  # a window of WINDOW keys, shorter than the probes
WINDOW = 4
DROPOUT_HINTS = ("dropout", "drop", "p_attn", "pdrop")  # any name containing one of these: 0.0
FLAG_NAMES = ("bias", "qkv_bias", "use_bias", "add_bias", "scale_attn_weights", "proj_bias")  # True
OFF_NAMES = ("output_attentions", "is_decoder", "use_cache", "add_cross_attention", "is_cross_attention",
             "output_hidden_states", "torchscript", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
             "qk_norm")  # False
DEVICE_NAMES = ("device",)  # "cpu"
SWITCH_ON = ("scale", "scaled", "scale_attn", "scale_attn_weights")  # False by default: turned on (GPT-2)
EPS_HINTS = ("eps", "epsilon")  # any name containing one of these: 1e-5
CONFIG_NAMES = ("config", "cfg", "conf", "args", "hparams", "params", "opt", "options", "settings", "hp")

_VALUES = {**{n: EMBED for n in QUERY_SIZE_NAMES + KEY_SIZE_NAMES + VALUE_SIZE_NAMES + EMBED_NAMES},
           **{n: HEADS for n in HEAD_NAMES}, **{n: HEAD_DIM for n in HEAD_DIM_NAMES},
           **{n: LENGTH for n in LENGTH_NAMES}, **{n: WINDOW for n in WINDOW_NAMES}, **{n: True for n in FLAG_NAMES},
           **{n: False for n in OFF_NAMES}, **{n: "cpu" for n in DEVICE_NAMES},
           **{n: DEFAULT_ROPE_BASE for n in ROPE_BASE_NAMES}}


def is_dropout(name: str) -> bool:
    low = name.lower()
    return any(hint in low for hint in DROPOUT_HINTS) and "num" not in low


# Words inside a name that is not listed above, tried in this order (OpenNMT's head_count, model_dim...).
PATTERNS = ((("len", "ctx", "positions", "block"), LENGTH), (("headdim", "headsize"), HEAD_DIM),
            (("head",), HEADS),
            (("dim", "size", "width", "hidden", "hid", "embed", "embd", "units", "channels"), EMBED))


def guess_value(name: str) -> tuple[bool, object]:
    """(True, value) for a name the checker recognises (listed, or with a telling word in it), else
    (False, None)."""
    low = name.lower()
    if is_dropout(name):
        return True, 0.0
    if name in _VALUES:
        return True, _VALUES[name]
    if any(hint in low for hint in EPS_HINTS):
        return True, 1e-5
    squeezed = low.replace("_", "").replace("per", "")  # dim_per_head -> dimhead
    squeezed = squeezed.replace("dimhead", "headdim").replace("sizehead", "headsize")
    for words, value in PATTERNS:
        if any(word in squeezed for word in words):
            return True, value
    return False, None


def is_head_count_name(name: str) -> bool:
    """A head count by its listed name or by the word "head" in it (head_count, nb_heads...)."""
    return name in HEAD_NAMES or (name not in _VALUES and guess_value(name) == (True, HEADS)
                                  and "head" in name.lower() and not is_head_size_name(name))


def is_head_size_name(name: str) -> bool:
    """The size of one head, by its listed name or its words (dim_per_head, head_width...)."""
    low = name.lower().replace("_", "").replace("per", "")
    return name in HEAD_DIM_NAMES or (name not in _VALUES and "head" in low
                                      and any(w in low for w in ("dim", "size", "width")))


def is_config_name(name: str, annotation: object = None) -> bool:
    """Does a constructor parameter look like it takes a config object (``config``, ``cfg``...)?"""
    low = name.lower()
    return low in CONFIG_NAMES or low.endswith(("config", "cfg")) or "Config" in str(annotation or "")


def short_tried_text(lang: str = "en") -> str:
    """The groups of names the checker recognises, two examples each, on one line (``tried_text``: all of them)."""
    zh = lang == "zh"
    groups = [(("sizes", "宽度"), EMBED_NAMES), (("heads", "头数"), HEAD_NAMES), (("head sizes", "每个头的维度"),
              HEAD_DIM_NAMES), (("lengths", "长度"), LENGTH_NAMES), (("windows", "窗口"), WINDOW_NAMES)]
    listed = ("；" if zh else "; ").join(f"{label[zh]} {', '.join(names[:2])}..." for label, names in groups)
    return listed + ("；以及 dropout、bias 之类的开关" if zh else "; dropout and bias flags")


def tried_text(lang: str = "en") -> str:
    """The names the checker recognises, grouped, for messages (``lang``: "en" or "zh")."""
    zh = lang == "zh"
    groups = [(("sizes", "宽度"), QUERY_SIZE_NAMES + EMBED_NAMES),
              (("key/value sizes", "键/值宽度"), KEY_SIZE_NAMES + VALUE_SIZE_NAMES),
              (("heads", "头数"), HEAD_NAMES), (("head sizes", "每个头的维度"), HEAD_DIM_NAMES),
              (("lengths", "长度"), LENGTH_NAMES), (("windows", "窗口"), WINDOW_NAMES),
              (("RoPE bases", "RoPE 底数"), ROPE_BASE_NAMES), (("flags", "开关"), FLAG_NAMES + OFF_NAMES + DEVICE_NAMES)]
    sep, colon = ("；", "：") if zh else ("; ", ": ")
    listed = sep.join(f"{label[zh]}{colon}{', '.join(dict.fromkeys(names))}" for label, names in groups)
    words = sep.join(f"{'/'.join(w)} -> {v}" for w, v in PATTERNS)
    if zh:
        return f"{listed}；dropout：名字里含 {'/'.join(DROPOUT_HINTS)} 的都算；其他名字按所含的词猜：{words}"
    return f"{listed}; dropout: any name with {'/'.join(DROPOUT_HINTS)}; other names containing {words}"
