"""The quantized backend: attention over a quantized KV cache's codes and scales (kv_forms.Quantized).

A decode step (at most MAX_ROWS query rows per sequence, eager on the CPU or under torch.compile once the
kernel is loaded, one scale per key row, a mask of one interval of keys per row) runs the C++ kernel's
quantized build (decode_quant.kernel_step). Everything else (prefill over a filled cache, other devices,
no kernel, a latent cache's rows with two scales, masks that are not intervals) runs
decode_quant.blockwise, BLOCK keys at a time. A prompt into an empty cache never comes here: dispatch reads
its fresh float keys (kv_forms.py). Inference only. Its plan serves every key length (RowsAtLength).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.backends.capabilities import Capabilities
from multihead.backends.common import sink_alone
from multihead.backends.cpu.build import kernel, loaded
from multihead.backends.decode.quantized_numerics import BLOCK, blockwise, kernel_step
from multihead.backends.decode.ranges import RowsAtLength, rows_of
from multihead.backends.graphs import recorded_graph
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot
from multihead.masks.normal_form import EMPTY

MAX_ROWS = 4  # query rows per sequence up to which the kernel's step runs
SCORED = cannot("quantized.scored", "a score function (Mask.score_mod) needs the whole grid's scores")


@dataclass
class QuantizedPlan:
    rows: RowsAtLength | None  # each row's interval of keys; None: the mask is dense (sliced block by block)
    kernel: bool  # the C++ kernel's step


class QuantizedBackend:
    """Plan: QuantizedPlan."""

    name = "quantized"
    reads_values = False  # its plan reads shapes and the form's structure; run reads the mask's values
    capabilities = Capabilities(kv_forms=("quantized",), dropout=False, backward=False, lse=True)

    def plan(self, p: Problem, auto: bool = True):
        if p.form.scored:
            return SCORED
        if not p.form.intervals_only:
            return QuantizedPlan(None, False)
        compiling = torch.compiler.is_compiling()
        built = loaded() if compiling else kernel()
        step = (built is not None and p.q.device.type == "cpu" and not recorded_graph()
                and p.dims[2] <= MAX_ROWS and p.k.split is None and p.v.split is None
                and p.k.codes.stride(-1) == 1 and p.v.codes.stride(-1) == 1)
        return QuantizedPlan(RowsAtLength(p), step)

    def keys_from(self, p: Problem, plan: QuantizedPlan, auto: bool) -> int:
        """Any key length: the plan reads Lk only through RowsAtLength (and a dense mask is made per call)."""
        return 0

    def describe(self, p: Problem, plan: QuantizedPlan) -> str:
        codes = str(p.k.kv_dtype)
        if plan.kernel:
            return (f"C++ decode kernel's quantized step over {codes} codes: codes widened in registers, each "
                    "token's scale on its score and its value's weight, online softmax in fp32")
        mask = "each row's interval of keys" if plan.rows is not None else "the dense mask, sliced"
        return (f"{codes} codes dequantized to fp32 {BLOCK} keys at a time, online softmax merged by the "
                f"log-sum-exp; {mask}")

    def run(self, p: Problem, plan: QuantizedPlan):
        B, H, Lq, Lk = p.dims
        if plan.rows is None:
            full = rows_of(EMPTY, B, H, Lq, Lk, p.q.device)  # every key; the dense mask decides
            dense = p.dense_mask(torch.float32)
            return blockwise(p.q, p.k, p.v, full.lo, full.hi, full.qpos, p.scale, p.softcap, None, p.sinks,
                             dense=dense, with_lse=p.lse)
        lo, hi, qpos, slopes = plan.rows.rows(p)
        if plan.kernel:
            result = kernel_step(None, p.q, p.k, p.v, lo, hi, qpos, p.scale, p.softcap, slopes, p.sinks, p.lse)
            return (result[0], sink_alone(result[1], p.sinks)) if p.lse else result
        return blockwise(p.q, p.k, p.v, lo, hi, qpos, p.scale, p.softcap, slopes, p.sinks, with_lse=p.lse)
