"""Which form runs a decode step on this CPU: the C++ kernel or the plain-torch form, by measurement.

The decode backend knows two forms of the same step: the C++ kernel (decode_kernel.cpp, built for the
host: its path is the build's ISA, `decode_build.isa()`) and the plain-torch form (`plain_decode_step`).
The rule: where the two were measured for the build's ISA and the dtype, the faster one runs; a
backend never runs a form slower than a simpler one it knows.

FASTER records the outcome of benchmarks/decode_isa.py (cold K/V read share, one thread, B=1 H=32
Hkv=8 D=128 at N = 4096 and 16384, the kernel of every build against the plain-torch form and SDPA on
grouped queries, interleaved; results and the machine in benchmarks/decode-isa.json, and a test checks
that FASTER names the faster form there). The AVX2 entries come from benchmarks/decode-isa-avx2.json: the
same script on the same AVX-512 machine with torch itself held to AVX2 (ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2; the file records cpu_capability "AVX2"), so that the AVX2 build of the kernel meets
the plain-torch form as an AVX2-only CPU would run it: fp32 52% and 64% of the read bandwidth against 35% and
38% at N = 4096 and 16384, bf16 50% and 45% against 4% (torch's bf16 matrix products without AVX-512 fall
to a slow path). An AVX2-only CPU's own memory system was not measured. SDPA on grouped queries is recorded
as a peer: it is not a form of this backend. For an ISA not measured (a NEON build, say) the kernel runs: the SSE2 build of
the portable path, the nearest measured build, reads faster than the plain-torch form whose matrix
products run AVX-512 code on the same machine.
"""
from __future__ import annotations

import torch

KERNEL, PLAIN = "kernel", "plain-torch"
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}

# (build ISA, dtype) -> the faster form, measured (see the module docstring)
FASTER: dict[tuple[str, str], str] = {
    ("avx512-bf16", "fp32"): KERNEL,
    ("avx512-bf16", "bf16"): KERNEL,
    ("avx2", "fp32"): KERNEL,  # measured with torch held to AVX2 (decode-isa-avx2.json)
    ("avx2", "bf16"): KERNEL,
    ("portable-sse2", "fp32"): KERNEL,
    ("portable-sse2", "bf16"): KERNEL,
}


def faster_form(isa: str, dtype: torch.dtype) -> str:
    """KERNEL or PLAIN: the form measured faster for the build `isa` and `dtype` (KERNEL if unmeasured)."""
    return FASTER.get((isa, DTYPE_NAMES.get(dtype, str(dtype))), KERNEL)


def measured(isa: str, dtype: torch.dtype) -> bool:
    """Whether FASTER holds a measurement for the build `isa` and `dtype`."""
    return (isa, DTYPE_NAMES.get(dtype, str(dtype))) in FASTER
