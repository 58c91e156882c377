"""The walkthrough: one forward pass, step by step, on live tensors (also through a real model)."""
