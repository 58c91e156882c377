"""The decode family: a few new query rows per sequence against a KV cache, on the CPU: the decode
backend over tensors, the paged backend over pages, the quantized backend over int8/fp8 codes, and their
shared forms (the kernel's row ranges, the step in C++ or plain torch, the numerics over codes)."""
