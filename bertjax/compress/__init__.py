"""Compressing a pretrained model: distillation, quantization, attention-head pruning, and head analysis."""
