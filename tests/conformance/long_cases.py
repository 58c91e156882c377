"""The campaign's long slice: random calls over at least 2048 keys, each drawn for one backend so that it runs.

Where the fast paths engage the shapes are long, so each backend gets the calls it takes, asked for by name:

    varlen   one slicing term (lengths (B,), or segments in runs) and other kinds on top; Lq up to 300
    banded   a window or chunks, with causal and other kinds on top; Lq up to 600 (blocks of 64..512 queries)
    decode   1 to 4 query rows, terms that keep one interval per row, ALiBi, softcap, sinks; fp32 / bf16, no grad
    flex     any kinds, softcap, sinks; up to 32 query rows (eager flex materialises the scores); no grad

`make_long_case(rng, backend)` returns (Case, mode). Lk is 2048 to 2600, B and H small, D 8 or 16, so the
float64 reference stays cheap.
"""
from __future__ import annotations

import random

import torch

from tests.conformance.cases import DTYPES, Case, make_part

LONG_BACKENDS = ("varlen", "banded", "decode", "flex")
MIN_KEYS, MAX_KEYS = 2048, 2600
GRAD_FREE = ("no_grad", "inference_mode")  # decode and torch's CPU flex have no backward
ALL_MODES = ("grad", *GRAD_FREE)

# per backend: (kinds the slicing / required term is drawn from, kinds drawn on top, most query rows, dtypes,
# modes, whether softcap and sinks are drawn)
PLANS = {
    "varlen": (("lengths", "segments"), ("causal", "window", "alibi", "key_padding", "score_mod"), 300, DTYPES,
               ALL_MODES, False),
    "banded": (("window", "chunks"), ("causal", "alibi", "key_padding", "lengths_per_query", "mask_mod"), 600,
               DTYPES, ALL_MODES, False),
    "decode": (("causal", "window", "chunks", "lengths"), ("causal", "window", "chunks", "alibi"), 4,
               (torch.float32, torch.bfloat16), GRAD_FREE, True),
    "flex": (("causal", "window", "lengths", "key_padding", "segments", "alibi", "additive", "mask_mod",
              "score_mod"), ("causal", "window", "chunks", "keep"), 32, DTYPES, GRAD_FREE, True),
}


def make_long_case(rng: random.Random, backend: str) -> tuple[Case, str]:
    """A random call over >= 2048 keys that `backend` takes (see the module docstring), and its mode."""
    required, extra, max_rows, dtypes, modes, variants = PLANS[backend]
    H = rng.choice((1, 2, 4))
    Lk = rng.randint(MIN_KEYS, MAX_KEYS)
    Lq = rng.randint(1, max_rows) if backend != "varlen" or rng.random() < 0.5 else Lk
    case = Case(B=rng.choice((1, 2)), H=H, Hkv=rng.choice([d for d in (1, 2, 4) if H % d == 0]), Lq=Lq, Lk=Lk,
                D=rng.choice((8, 16)), dtype=rng.choice(dtypes), seed=rng.getrandbits(31))
    g = torch.Generator().manual_seed(case.seed + 1)
    kinds = [rng.choice(required)] + [rng.choice(extra) for _ in range(rng.randint(0, 2))]
    if backend == "decode":  # one ALiBi at most, one lengths part at most: the decode step's own terms
        kinds = list(dict.fromkeys(kinds))
    if backend == "varlen":  # exactly one term cuts the rows into slices
        kinds = [kinds[0]] + [k for k in kinds[1:] if k not in ("lengths", "segments")]
    rng.shuffle(kinds)
    bottom_right = backend == "decode" or backend == "banded" and rng.random() < 0.7  # queries at the end
    for kind in kinds:
        spec = make_part(kind, case, rng, g)
        if bottom_right and spec.kind in ("causal", "window", "chunks", "alibi"):
            spec.args["align"] = "bottom_right"
        if spec.kind in ("window", "chunks"):
            spec.args["size"] = rng.randint(1, 600)  # a band far narrower than the keys: blocks skip most
        if spec.kind == "segments" and backend == "varlen":  # runs of ids: every row cuts into slices
            spec.args = {name: ids.sort(dim=-1).values for name, ids in spec.args.items()}
        case.specs.append(spec)
    if variants and rng.random() < 0.3:
        case.softcap = rng.uniform(1.0, 20.0)
    if variants and rng.random() < 0.3:
        case.sinks = torch.randn(H, generator=g)
    return case, rng.choice(modes)
