"""The attention layers: MultiHeadAttention and its variants (gated, differential, latent (MLA), DeepSeek V4's
shared K = V head, its indexer and compressor)."""
