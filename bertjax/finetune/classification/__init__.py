"""The classification family (GLUE's sentence(-pair) classification and regression): `task` (the trainer's
calls), `data` (TSV / tfds splits), `model` (the Classifier heads), `metrics` (GLUE's), `hf` (saved classifiers,
transformers' *ForSequenceClassification), `predict` (python -m bertjax.finetune.predict's part) and `glue`
(the suite's GLUE tasks, recipes and table). Its `family` module registers it with the trainer."""
