"""Cache bytes per token and layer at the released models' dimensions, from the caches' own buffers (bf16).

The dimensions are transformers' config defaults, which are the released models' values: DeepSeek V3
(DeepseekV3Config), V3.2 (DeepseekV32Config), GLM-5 (GlmMoeDsaConfig), V4-Flash (DeepseekV4Config) and,
for grouped-query attention, Mistral 7B (MistralConfig). Each cache is built at those sizes (one
sequence, 512 tokens) and its buffers' bytes divided by the tokens they hold are compared with the
formula from the config and with the table in docs/mla.md ("Cache bytes per token").
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import multihead as mh
from multihead.layers.compressor import CompressorState
from multihead.caches.latent import LatentCache
from multihead.caches.shared_kv import SharedKVCache

pytestmark = pytest.mark.models
transformers = pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[1] / "docs" / "mla.md"
M, BF16 = 512, torch.bfloat16


def per_token(cache) -> float:
    """Bytes of the buffers that grow with the sequence, divided by the tokens they hold."""
    growing = [b for name, b in cache.named_buffers() if name != "lengths" and b.dim() >= 3
               and "pending" not in name and "overlap" not in name and name != "window"]
    return sum(b.nbytes for b in growing) / M


def v4_cache(config, layer_type: str) -> SharedKVCache:
    """A SharedKVCache at V4's sizes for one layer type (without building the layer's weights)."""
    D, W = config.head_dim, config.sliding_window
    if layer_type == "sliding_attention":
        return SharedKVCache(1, M, D, W, dtype=BF16)
    m = config.compress_rates[layer_type]
    sparse = layer_type == "compressed_sparse_attention"
    index = CompressorState(1, M // m, config.index_head_dim, m, True, dtype=BF16) if sparse else None
    return SharedKVCache(1, M, D, W, compressor=CompressorState(1, M // m, D, m, sparse, dtype=BF16), indexer=index,
                         rate=m, dtype=BF16)


def measured() -> dict[str, tuple[float, int]]:
    """{row of the doc's table: (bytes per token, fixed bytes per sequence)} from the buffers."""
    v3, v32, glm = transformers.DeepseekV3Config(), transformers.DeepseekV32Config(), transformers.GlmMoeDsaConfig()
    v4, mistral = transformers.DeepseekV4Config(), transformers.MistralConfig()
    mha = mh.KVCache(1, M, v3.num_attention_heads, v3.qk_nope_head_dim + v3.qk_rope_head_dim,
                     value_dim=v3.v_head_dim, dtype=BF16)
    head_dim = mistral.head_dim or mistral.hidden_size // mistral.num_attention_heads
    gqa = mh.KVCache(1, M, mistral.num_key_value_heads, head_dim, dtype=BF16)
    rows = {"MHA, DeepSeek V3's heads": mha, "GQA, Mistral 7B": gqa,
            "MLA, DeepSeek V3": LatentCache(1, M, v3.kv_lora_rank, v3.qk_rope_head_dim, dtype=BF16)}
    for name, config in (("MLA + indexer, DeepSeek V3.2", v32), ("MLA + indexer, GLM-5", glm)):
        rows[name] = LatentCache(1, M, config.kv_lora_rank, config.qk_rope_head_dim, index_dim=config.index_head_dim,
                                 dtype=BF16)
    names = {"sliding_attention": "V4 sliding", "compressed_sparse_attention": "V4 CSA",
             "heavily_compressed_attention": "V4 HCA"}
    rows.update({names[t]: v4_cache(v4, t) for t in names})
    return {name: (per_token(c), c.fixed_bytes() if isinstance(c, SharedKVCache) else 0) for name, c in rows.items()}


def test_bytes_per_token_follow_from_the_configs_and_the_caches_say_them():
    v3, v32, v4 = transformers.DeepseekV3Config(), transformers.DeepseekV32Config(), transformers.DeepseekV4Config()
    got = measured()
    H, K, V = v3.num_attention_heads, v3.qk_nope_head_dim + v3.qk_rope_head_dim, v3.v_head_dim
    assert got["MHA, DeepSeek V3's heads"][0] == H * (K + V) * 2 == 81920
    assert got["GQA, Mistral 7B"][0] == 8 * 128 * 2 * 2 == 4096
    assert got["MLA, DeepSeek V3"][0] == (v3.kv_lora_rank + v3.qk_rope_head_dim) * 2 == 1152
    assert got["MLA + indexer, DeepSeek V3.2"][0] == (v32.kv_lora_rank + v32.qk_rope_head_dim + v32.index_head_dim) * 2
    csa, hca = v4.compress_rates["compressed_sparse_attention"], v4.compress_rates["heavily_compressed_attention"]
    assert got["V4 CSA"][0] == (v4.head_dim + v4.index_head_dim) / csa * 2 == 320
    assert got["V4 HCA"][0] == v4.head_dim / hca * 2 == 8
    assert got["V4 sliding"] == (0, (v4.sliding_window - 1) * v4.head_dim * 2)  # K = V: each kept token once
    latent = LatentCache(1, M, v32.kv_lora_rank, v32.qk_rope_head_dim, index_dim=v32.index_head_dim, dtype=BF16)
    assert latent.bytes_per_token() == got["MLA + indexer, DeepSeek V3.2"][0]
    assert v4_cache(v4, "compressed_sparse_attention").bytes_per_token() == got["V4 CSA"][0]


def test_the_docs_table_quotes_these_numbers():
    section = DOC.read_text().split("## Cache bytes per token", 1)[1].split("\n## ", 1)[0]
    quoted = {}
    for line in [line for line in section.splitlines() if line.startswith("|")][2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        quoted[cells[0]] = (float(cells[2].replace(",", "")), int(re.sub(r"\D", "", cells[3]) or 0))
    got = measured()
    assert quoted == got
    mib = {name: int(got[name][0]) for name in ("V4 CSA", "V4 HCA", "MLA + indexer, DeepSeek V3.2", "GQA, Mistral 7B")}
    assert transformers.DeepseekV4Config().max_position_embeddings == 2 ** 20  # bytes per token x 2^20 = MiB
    v32, gqa = mib["MLA + indexer, DeepSeek V3.2"], mib["GQA, Mistral 7B"]
    assert (f"At V4's full context of 2^20 tokens a CSA layer holds {mib['V4 CSA']} MiB per sequence, an HCA layer\n"
            f"{mib['V4 HCA']} MiB, where V3.2's latent cache holds {v32:,} MiB and GQA at "
            f"Mistral 7B's sizes {gqa:,} MiB.") in DOC.read_text()
