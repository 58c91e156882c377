"""Topics on the attention of particular models: Llama 4's chunks, DiffLlama, Qwen3-Next's gate, MLA,
DeepSeek's sparse attention and V4's K = V head."""
