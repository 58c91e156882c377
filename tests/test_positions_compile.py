"""RoPE under torch.compile(fullgraph=True) and torch.export: one graph, no recompiles while decoding,
and the same numbers as eager, dynamic NTK's state included."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import multihead as mh

SCALINGS = {
    "default": None,
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
N = 8  # max_position: decoding past it makes dynamic NTK grow its base every step


def decode_steps(steps: int = 12):
    """Positions (B=2, 1) of successive decode steps, rows at different cached lengths."""
    return [torch.tensor([[step], [step + 3]]) for step in range(steps)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_compiled_decode_is_one_graph_with_no_recompiles(kind):
    compiled_rope, eager = (mh.RoPE(16, scaling=SCALINGS[kind], max_position=N) for _ in range(2))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(compiled_rope, fullgraph=True, backend=counter)
    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 1, 16)
    for positions in decode_steps():
        for ours, expected in zip(compiled(q, k, positions), eager(q, k, positions)):
            torch.testing.assert_close(ours, expected, atol=0, rtol=0)
    assert counter.frame_count == 1  # positions are tensors: new values never recompile
    if kind == "dynamic":
        assert int(compiled_rope.seen_length) == int(eager.seen_length) == 15


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_exported_program_matches_eager(kind):
    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 1, 16)
    program = torch.export.export(mh.RoPE(16, scaling=SCALINGS[kind], max_position=N), (q, k, decode_steps()[0]))
    exported, eager = program.module(), mh.RoPE(16, scaling=SCALINGS[kind], max_position=N)
    for positions in decode_steps():
        for ours, expected in zip(exported(q, k, positions), eager(q, k, positions)):
            torch.testing.assert_close(ours, expected, atol=0, rtol=0)
    if kind == "dynamic":
        assert int(exported.seen_length) == int(eager.seen_length)
