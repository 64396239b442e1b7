"""bertjax: pretraining BERT-family encoders (BERT, RoBERTa, ALBERT, ELECTRA) in JAX/Flax."""

from bertjax import host

__version__ = "0.1.0"

host.setup()  # before any JAX backend starts: see bertjax/host.py
