"""check's roles from the dataflow: projections seen only in the call (raw parameters, a Linear of the learner's
own), the pieces of a fused projection (uneven GQA splits), partial rotary, and MLA chains without an absorbed
path."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from helpers import edited_zoo_file
from multihead.checker import check
from multihead.checker.loading.learner_file import load_class
from multihead.checker.roles.projections import ProjectionInputs, find_projections
from multihead.checker.roles.assign import candidate_roles
from multihead.checker.behaviour.rotary import Rotary

ZOO = Path(__file__).parent / "check_zoo"


class RawUneven(nn.Module):
    """A raw fused parameter (E, (H + 2 Hkv) D) used as x @ W, cut unevenly; the output as W_o^T."""

    def __init__(self, scale=None):
        super().__init__()
        self.W_qkv = nn.Parameter(torch.randn(16, 32))
        self.W_o = nn.Parameter(torch.randn(16, 16))
        self.scale = scale

    def forward(self, x):
        q, k, v = (x @ self.W_qkv).split([16, 8, 8], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, 4)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=self.scale)
        return y.transpose(1, 2).flatten(2) @ self.W_o.T


def test_raw_parameters_are_projections_of_their_own_with_the_pieces_they_were_used_in():
    module, x = RawUneven().double(), torch.randn(3, 5, 16, dtype=torch.float64)
    assert find_projections(module) == {}
    with ProjectionInputs(module, {"x": x}) as seen:
        module(x)
    assert seen.seen == {"W_qkv": ["x"], "W_o": ["mid"]}
    assert [p.kind for p in seen.projections.values()] == ["traced", "traced"]
    assert [p.rows.tolist()[:1] + [len(p.rows)] for p in seen.pieces["W_qkv"]] == [[0, 16], [16, 8], [24, 8]]
    found = candidate_roles(module, seen.seen, True, 4, {"x": 16}, watched=seen)
    assert [a.describe() for a in found] == [  # keys and values have the same shape: behaviour orders them
        {"q": "W_qkv rows 0:16", "k": "W_qkv rows 16:24", "v": "W_qkv rows 24:32", "o": "W_o"},
        {"q": "W_qkv rows 0:16", "k": "W_qkv rows 24:32", "v": "W_qkv rows 16:24", "o": "W_o"}]
    weights = found[0].weights(module)
    assert torch.equal(weights.q[0], module.W_qkv[:, :16].T) and torch.equal(weights.o[0], module.W_o)
    assert (weights.num_heads, weights.num_kv_heads) == (4, 2)


def test_the_checker_passes_it_and_names_a_seeded_mistake():
    report = check(RawUneven())
    assert report.passed, str(report)
    assert report.roles["k"] == "W_qkv rows 16:24"
    assert check(RawUneven(scale=1.0)).bug == "missing-scale"


def test_partial_rotary_is_read_from_the_heads_used_in_two_parts():
    target = str(ZOO / "ok_phi3_partial_rotary.py:PartialRotaryAttention")
    learner = load_class(target)(16, 4).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    with ProjectionInputs(learner, {"x": x}) as seen:
        learner(x)
    assert [p.split for p in seen.pieces["qkv_proj"]] == [4, 4, None]  # q and k: [0:4] turned, [4:8] not
    roles = candidate_roles(learner, seen.seen, True, 4, {"x": 16}, watched=seen)
    right = [a for a in roles if (a.describe()["q"], a.describe()["k"]) == ("qkv_proj rows 0:32", "qkv_proj rows 32:48")]
    assert [a.rotary_dim for a in right] == [4]  # (q from the value rows: no rotary dim; behaviour rules it out)
    turned = replace(right[0], rope=Rotary(10000.0, False, False, True))
    assert turned.weights(learner).rope.rotary_dim == 4
    assert check(target).passed


def test_a_learners_mla_without_an_absorbed_path_is_judged_as_mla(tmp_path):
    target = ZOO / "ok_mla_naive_only.py"
    report = check(f"{target}:PaperMLA")
    assert report.passed and report.kind == "latent-naive", str(report)
    assert report.roles["latent"] == "W_DKV" and report.roles["q"] == "W_DQ, then W_UQ"
    assert "its forward alone is compared" in "\n".join(report.convention_lines())
    broken = edited_zoo_file(tmp_path, "ok_mla_naive_only.py", (" / (self.d_h + self.d_rope) ** 0.5", ""))
    assert not check(f"{broken}:PaperMLA").passed  # not MLA on its weights: judged as plain attention, no PASS
