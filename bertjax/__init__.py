"""bertjax: pretraining BERT-family encoders (BERT, RoBERTa, ALBERT, ELECTRA) in JAX/Flax.

Importing it has no side effects: entry points call `bertjax.core.runtime.setup()` first.
"""

__version__ = "0.1.0"
