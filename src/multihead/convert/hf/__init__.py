"""Converters from Hugging Face transformers' attention layers, one family per file."""
