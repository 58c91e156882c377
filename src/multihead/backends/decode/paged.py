"""The paged backend: a decode step over a paged KV cache's pages, read in place through its block table.

The C++ kernel's paged step (Kernel.decode_paged, decode_paged.h; its custom op under torch.compile) reads
each sequence's pages where they lie: float32 / bfloat16 pages, or int8 / fp8 e4m3 codes with their scales.
It takes the masks whose normal form is one interval of keys per query row (a cache's bottom-right causal
mask over each sequence's length, windows, chunks, ALiBi), softcap and sinks, and returns the log-sum-exp.
A paged view outside a decode step (a prompt) or without the kernel is gathered by dispatch first
(kv_forms.resolved) and runs as plain tensors or codes. Inference only. Its plan serves every key length
and every block table (RowsAtLength): the table is read at run time.
"""
from __future__ import annotations

import torch

from multihead.backends.capabilities import Capabilities
from multihead.backends.common import sink_alone
from multihead.backends.cpu import ops
from multihead.backends.cpu.build import kernel
from multihead.backends.decode.ranges import RowsAtLength
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot

MASK = cannot("paged.mask", "the paged step takes masks that keep one interval of keys per query row (lengths, "
                            "causal, window, chunks) and one ALiBi", any_length=True)
NO_KERNEL = cannot("paged.kernel", "the C++ decode kernel is not built here (a paged view is then gathered)",
                   any_length=True)
_EMPTY = torch.empty(0)


class PagedBackend:
    """Plan: RowsAtLength (each row's interval of keys, ALiBi's positions and slopes)."""

    name = "paged"
    capabilities = Capabilities(kv_forms=("paged",), devices=("cpu",), dtypes=(torch.float32, torch.bfloat16),
                                dropout=False, backward=False, recorded=False, lse=True)
    reads_values = False  # the rows come from the form at run time; the block table is read by the kernel

    def plan(self, p: Problem, auto: bool = True):
        if not p.form.intervals_only:
            return MASK
        if kernel() is None:
            return NO_KERNEL
        return RowsAtLength(p)

    def keys_from(self, p: Problem, plan: RowsAtLength, auto: bool) -> int:
        return 0

    def describe(self, p: Problem, plan: RowsAtLength) -> str:
        k = p.k
        pages = "float" if k.kv_dtype is None else str(k.kv_dtype).replace("torch.", "")
        return (f"C++ decode kernel's paged step: {pages} pages of {k.pages.shape[2]} tokens read in place through "
                f"the block table ({k.block_table.shape[1]} pages per sequence), online softmax in fp32")

    def run(self, p: Problem, plan: RowsAtLength):
        lo, hi, qpos, slopes = plan.rows(p)
        k, v = p.k, p.v
        fp8 = k.kv_dtype is torch.float8_e4m3fn  # codes stored as their bytes: the kernel reads e4m3
        kp, vp = (t.pages.view(torch.float8_e4m3fn) if fp8 else t.pages for t in (k, v))
        table = k.block_table if k.block_table.dtype is torch.int32 and k.block_table.is_contiguous() \
            else k.block_table.to(torch.int32).contiguous()
        out, lse = ops.call("decode_paged", p.q.contiguous(), kp, vp, table, lo, hi, qpos,
                            _EMPTY if slopes is None else slopes, _EMPTY if p.sinks is None else p.sinks.float(),
                            p.scale, p.softcap or 0.0, k.scales, v.scales, p.lse)
        out = out.to(p.q.dtype)
        return (out, sink_alone(lse, p.sinks)) if p.lse else out
