"""The walkthrough: one forward pass of multi-head attention, step by step, on live tensors.

`default_setup()` is the embedded default: document 001's six-token, 3-dim input
("Your journey starts with one step") and the weights its `torch.manual_seed(123)` creates,
dim_in 3 -> dim_out 4 with 2 heads and a causal mask. `tell(story, setup)` runs every step,
filling the story with code, shapes, tensors, one reason per step, and live checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

import multihead as mh
from multihead.explain import words
from multihead.explain.say import both, walkthrough_say
from multihead.explain.story import LANGS, Story
from multihead.explain.topics import TOPICS
from multihead.explain.walkthrough.attend import step_mask, step_scale, step_scores, step_softmax, step_weighted_sum
from multihead.explain.walkthrough.output import step_merge, step_out_proj, step_verify
from multihead.explain.walkthrough.project import step_input, step_project, step_split

# Document 001's `inputs` (from its attention_v1.py): one 3-dim embedding per token.
DOC001_TOKENS = ["Your", "journey", "starts", "with", "one", "step"]
DOC001_INPUTS = [
    [0.43, 0.15, 0.89],
    [0.55, 0.87, 0.66],
    [0.57, 0.85, 0.64],
    [0.22, 0.58, 0.33],
    [0.77, 0.25, 0.10],
    [0.05, 0.80, 0.55],
]
# What document 001 printed for `MultiHeadAttention(3, 4, 6, 0.0, 2)` after torch.manual_seed(123)
# (each batch row; its batch held the same sentence twice).
DOC001_OUTPUT = [
    [0.1184, 0.3120, -0.0847, -0.5774],
    [0.0178, 0.3221, -0.0763, -0.4225],
    [-0.0147, 0.3259, -0.0734, -0.3721],
    [-0.0116, 0.3138, -0.0708, -0.3624],
    [-0.0117, 0.2973, -0.0698, -0.3543],
    [-0.0132, 0.2990, -0.0689, -0.3490],
]


@dataclass
class Setup:
    """What the walkthrough runs on: x (B, L, E), a module, the token names, and the mask kind."""

    x: torch.Tensor
    module: mh.MultiHeadAttention
    tokens: list[str]
    causal: bool
    input_code: tuple[str, str]          # (en, zh) how x was made, shown in step 1
    about: tuple[str, str]               # (en, zh) one sentence on where x and the weights come from
    expected: torch.Tensor | None = None  # an independently known output (B, L, O), if any
    expected_from: tuple[str, str] = ("", "")
    heatmaps: bool = True                 # draw the weights' heatmaps in step 7


@dataclass
class Pass:
    """The tensors of one forward pass, filled in as the steps run (names as in the shown code)."""

    setup: Setup
    t: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(B, L, H, D) of this pass."""
        B, L, _ = self.setup.x.shape
        m = self.setup.module
        return B, L, m.num_heads, m.head_dim


def doc001_module() -> mh.MultiHeadAttention:
    """Document 001's weights: under manual_seed(123) it builds Wq, Wk, Wv (no bias), then Wo."""
    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        torch.manual_seed(123)
        wq, wk, wv = (nn.Linear(3, 4, bias=False) for _ in range(3))
        wo = nn.Linear(4, 4)
        attn = mh.MultiHeadAttention(3, 2, head_dim=2, out_dim=4, bias={"q": False, "k": False, "v": False},
                                     backend="math")
    with torch.no_grad():
        for proj, src in ((attn.q_proj, wq), (attn.k_proj, wk), (attn.v_proj, wv), (attn.out_proj, wo)):
            proj.weight.copy_(src.weight)
            if src.bias is not None:
                proj.bias.copy_(src.bias)
    return attn.eval()


def doc001_input_code() -> tuple[str, str]:
    """How step 1 says the default input and weights were made, (en, zh)."""
    code = (
        "x = torch.tensor([[0.43, 0.15, 0.89],   # Your\n"
        "                  [0.55, 0.87, 0.66],   # journey\n"
        "                  ...                   # starts with one step\n"
        "                  [0.05, 0.80, 0.55]])[None]   # (B=1, L=6, E=3)\n"
        "torch.manual_seed(123)   # {weights}\n"
        "attn = mh.MultiHeadAttention(3, num_heads=2, head_dim=2, out_dim=4, ...)"
    )
    return tuple(code.format(weights=weights) for weights in both("default", "weights"))


def default_setup() -> Setup:
    """The embedded default: document 001's sentence and seed-123 weights, batch of 1, causal."""
    return Setup(
        x=torch.tensor(DOC001_INPUTS)[None],  # (B=1, L=6, E=3)
        module=doc001_module(),
        tokens=list(DOC001_TOKENS),
        causal=True,
        input_code=doc001_input_code(),
        about=both("default", "about", title={lang: words.document(lang, "001")["title"] for lang in LANGS}),
        expected=torch.tensor(DOC001_OUTPUT)[None],
        expected_from=both("default", "expected_from"),
    )


STEPS = [   # (the step, its title's id in the words' walkthrough/steps)
    (step_input, "input"),
    (step_project, "project"),
    (step_split, "split"),
    (step_scores, "scores"),
    (step_scale, "scale"),
    (step_mask, "mask"),
    (step_softmax, "softmax"),
    (step_weighted_sum, "weighted_sum"),
    (step_merge, "merge"),
    (step_out_proj, "out_proj"),
    (step_verify, "verify"),
]


def tell(story: Story, setup: Setup | None = None) -> Pass:
    """Run every step on `setup` (default: document 001's) and tell it in `story`."""
    setup = default_setup() if setup is None else setup
    B, L, E = setup.x.shape
    m = setup.module
    say = walkthrough_say(story, "intro")
    say.heading("heading", B=B, L=L, E=E, H=m.num_heads, D=m.head_dim)
    story.text(*setup.about)
    say.text("letters")
    p = Pass(setup)
    with torch.no_grad():
        for number, (step, _) in enumerate(STEPS, start=1):
            story.heading(*step_title(number))
            step(story, p)
    return p


def step_title(number: int) -> tuple[str, str]:
    """Step `number`'s heading (1-based), (en, zh): "Step 4 · Attention scores: Q @ Kᵀ"."""
    _, key = STEPS[number - 1]
    return both("intro", "step_title", number=number,
                title={lang: words.words(lang)["walkthrough"]["steps"][key] for lang in LANGS})


def tell_closing(story: Story) -> None:
    """The closing note: every question the documents ask, with the topic that answers it live."""
    say = walkthrough_say(story, "closing")
    say.heading("heading")
    say.text("text")
    rows = [[topic.document, topic.question[story.lang], name] for name, topic in TOPICS.items()]
    story.table([say("col.doc"), say("col.question"), say("col.topic")], rows)
    documents = words.words(story.lang)["documents"]
    story.table([say("col.doc"), say("col.title")],
                [[number, document["title"]] for number, document in documents.items()],
                title=say("label.documents"))

