"""bertjax: pretraining BERT-family encoders (BERT, RoBERTa, ALBERT, ELECTRA) in JAX/Flax."""

__version__ = "0.1.0"
