"""Data: sources, tokenizers, instances and the deterministic loader."""
