"""The multiple-choice family (SWAG, RACE-style JSONL): `task` (the trainer's calls), `data` (readers and
pair features), `model` (MultipleChoice), `hf` (saved models, transformers' BertForMultipleChoice) and `predict`
(python -m bertjax.finetune.predict's part). Its `family` module registers it with the trainer."""
