"""The squad family (extractive QA, SQuAD v1.1 and v2.0): `task` (the trainer's calls), `data` (the questions),
`features` (windows and span labels), `model` (SpanQA), `post` (n-best answers), `evaluate` (the official
metrics; `python -m bertjax.finetune.squad.evaluate` scores a predictions file), `hf` (saved models,
transformers' *ForQuestionAnswering) and `predict` (python -m bertjax.finetune.predict's part). Its `family` module
registers it with the trainer."""
