"""What check hands a layer besides its input (loading/forward_args.py), the config class defaults it builds with
(config.class_defaults) and an MLA file's form switch (latent_switch.find_switch)."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from multihead.checker.loading.config import class_defaults
from multihead.checker.loading.forward_args import Filler, choose_sizes, filler_for, size_candidates
from multihead.checker.targets.latent_switch import find_switch
from multihead.checker.loading.constructor_args import LENGTH


@pytest.mark.parametrize("name, kind", [("start_pos", "start"), ("position_ids", "positions"),
                                        ("freqs_cis", "table"), ("position_embeddings", "cos_sin"),
                                        ("cos", "cos"), ("freqs_sin", "sin"), ("mask", None)])
def test_fillers_are_found_by_name(name, kind):
    filler = filler_for(name)
    assert (filler and filler.kind) == kind


def test_filled_values_turn_position_t_by_t_times_the_frequency():
    x = torch.zeros(2, 5, 16, dtype=torch.float64)  # (B, L, E)
    R = 4
    angles = torch.arange(5.0, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, R, 2) / R)  # (L, R/2)
    assert Filler("s", "start").value(x) == 0
    assert torch.equal(Filler("p", "positions").value(x), torch.arange(5)[None])
    table = Filler("f", "table", R).value(x)
    assert table.shape == (5, R // 2) and table.dtype == torch.complex128
    torch.testing.assert_close(table.angle(), torch.atan2(angles.sin(), angles.cos()))
    halves = torch.cat((angles, angles), dim=-1)  # (L, R): the half-split layout
    torch.testing.assert_close(Filler("c", "cos", R).value(x), halves.cos())
    torch.testing.assert_close(Filler("s", "sin", R).value(x), halves.sin())
    cos, sin = Filler("e", "cos_sin", R).value(x)
    assert cos.shape == sin.shape == (1, 5, R)
    torch.testing.assert_close(sin[0], halves.sin())


def test_rotary_sizes_named_first_then_head_size_then_every_even_size():
    assert size_candidates(16, 4, {"qk_rope_head_dim": 6})[:3] == [6, 4, 16]
    assert size_candidates(8, None, {}) == [8, 6, 4, 2]


def test_cos_and_sin_get_one_size_together():
    cos, sin, start = filler_for("cos"), filler_for("sin"), filler_for("start_pos")
    x = torch.zeros(1, 3, 16)
    runs = lambda: cos.value(x).shape == sin.value(x).shape == (3, 6)  # noqa: E731 (a layer with R = 6)
    choose_sizes([cos, sin, start], runs, 16, 4, {})
    assert (cos.size, sin.size, start.size) == (6, 6, None)
    choose_sizes([cos, sin], lambda: False, 16, 4, {})
    assert cos.size is None and sin.size is None


@dataclasses.dataclass
class _Args:
    dim: int = 32
    max_seq_len: int = 16384


def test_config_class_defaults_cap_context_lengths():
    assert class_defaults(_Args, _Args) == {"dim": 32, "max_seq_len": LENGTH}
    assert class_defaults("_Args", _Args) == {"dim": 32, "max_seq_len": LENGTH}  # a string annotation
    assert class_defaults(dict, _Args) == {}


def test_an_mla_file_switch_is_found_and_points_both_ways():
    file = types.ModuleType("learner_mla_file")
    file.attn_impl = "absorb"
    cls = type("MLA", (), {"__module__": file.__name__})
    sys.modules[file.__name__] = file
    try:
        switch = find_switch(cls)
        assert (switch.name, switch.naive, switch.absorbed) == ("attn_impl", "naive", "absorb")
        switch.hold()
        assert file.attn_impl == "naive"
        with switch.set(switch.absorbed):
            assert file.attn_impl == "absorb"
        switch.release()
        assert file.attn_impl == "absorb"
        file.attn_impl = "flash"  # no naive or absorbed word: no switch
        assert find_switch(cls) is None
    finally:
        del sys.modules[file.__name__]
