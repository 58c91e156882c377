"""alibi_slopes against the ALiBi paper's recipe (written here in its start-and-ratio form, in float64)
and against BLOOM's `build_alibi_tensor` from transformers."""
from __future__ import annotations

import math

import pytest
import torch

import multihead as mh

HEAD_COUNTS = [1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 30, 32, 40, 64, 71, 96, 112]


def paper_slopes(n: int) -> list[float]:
    """The paper's recipe: a geometric sequence whose start is also its ratio; for a head count that is
    not a power of two, the sequence of the power below, then every other slope of the one above."""
    def power_of_two(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    below = 2 ** math.floor(math.log2(n))
    return power_of_two(below) + paper_slopes(2 * below)[0::2][: n - below]


@pytest.mark.parametrize("num_heads", HEAD_COUNTS)
def test_slopes_follow_the_paper(num_heads):
    slopes = mh.alibi_slopes(num_heads, dtype=torch.float64)
    assert slopes.shape == (num_heads,)
    torch.testing.assert_close(slopes, torch.tensor(paper_slopes(num_heads), dtype=torch.float64),
                               atol=0, rtol=1e-12)


def test_power_of_two_slopes_halve_the_exponent_spacing_of_half_as_many_heads():
    eight, sixteen = mh.alibi_slopes(8, dtype=torch.float64), mh.alibi_slopes(16, dtype=torch.float64)
    torch.testing.assert_close(sixteen[1::2], eight, atol=0, rtol=1e-12)  # 16 heads interleave the 8
    assert torch.all(eight > 0) and torch.all(eight[1:] < eight[:-1]) and mh.alibi_slopes(8)[0] == 0.5


@pytest.mark.models
@pytest.mark.parametrize("num_heads", [4, 6, 12, 16, 20, 30, 32, 112])
def test_slopes_equal_bloom(num_heads):
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    alibi = bloom.build_alibi_tensor(torch.ones(1, 3), num_heads, torch.float32)  # (1 * H, 1, L): slope · j
    torch.testing.assert_close(mh.alibi_slopes(num_heads), alibi[:, 0, 1], atol=0, rtol=1e-6)


def test_dtype_and_device_follow_the_request():
    slopes = mh.alibi_slopes(12, device="meta", dtype=torch.bfloat16)
    assert slopes.dtype == torch.bfloat16 and slopes.device.type == "meta"


@pytest.mark.parametrize("bad, message", [
    (0, r"positive integer head count; got 0"),
    (12.0, r"positive integer head count; got 12\.0"),
    (True, r"positive integer head count; got True"),
])
def test_bad_head_counts_are_refused(bad, message):
    with pytest.raises(mh.AttentionError, match=message):
        mh.alibi_slopes(bad)


def test_integer_dtypes_are_refused():
    with pytest.raises(mh.AttentionError, match=r"floating dtype; got torch\.int64"):
        mh.alibi_slopes(8, dtype=torch.int64)
