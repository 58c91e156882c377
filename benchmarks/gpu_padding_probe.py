"""Where the padded-batch time goes on a GPU: the mask form SDPA gets, and the inert-key pass.

    PYTHONPATH=src python benchmarks/gpu_padding_probe.py   (on a CUDA machine; never run by the tests)
"""
import torch, torch.nn.functional as F, multihead as mh

B, H, N, D = 8, 8, 4096, 64
dev, dt = "cuda", torch.bfloat16
q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(3))
lens = torch.linspace(N // 8, N, B, device=dev).long()
keep = (torch.arange(N, device=dev)[None] < lens[:, None])[:, None, None, :]
fmask = torch.where(keep, 0.0, torch.finfo(dt).min).to(dt)
hid = ~keep.transpose(-1, -2)
mask = mh.Mask.lengths(lens)

def t(f, n=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); [f() for _ in range(n)]; e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n

with torch.no_grad():
    print("sdpa bool mask      ", t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep)))
    print("sdpa float mask     ", t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=fmask)))
    print("where on k and v    ", t(lambda: (torch.where(hid, 0, k), torch.where(hid, 0, v))))
    print("ours (lengths)      ", t(lambda: mh.attention(q, k, v, mask)))
    print(mh.dispatch(q, k, v, mask))
