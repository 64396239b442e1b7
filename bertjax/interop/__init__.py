"""Interoperability with HF transformers checkpoints: safetensors I/O, config and weight mapping, tokenizers."""
