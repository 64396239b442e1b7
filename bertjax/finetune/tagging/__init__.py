"""The tagging family (NER, chunking, POS): `task` (the trainer's calls), `data` (CoNLL / tfds sentences and
windowed features), `model` (TokenClassifier), `metrics` (conlleval's), `hf` (saved taggers, transformers'
*ForTokenClassification) and `predict` (python -m bertjax.finetune.predict's part). Its `family` module registers the
family with the trainer."""
