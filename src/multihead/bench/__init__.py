"""`multihead bench`: ours against every peer, in one run, on this machine.

Suites (each a module here): shootout (module vs peers, forward and forward+backward), scaling (time
and peak memory as N grows), padded (the length-aware path vs dense masks), roofline (GEMM rate,
memory bandwidth, attention FLOP rates) and small (decode-like shapes, Python overhead).
Ratios are what count: absolute times move with the machine's load, ratios measured in one
interleaved run do not.
"""
