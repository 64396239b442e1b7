"""Fine-tuning pretrained encoders: one trainer (`train`) and task families plugged into it (`tasks`).

`python -m bertjax.finetune` (`__main__.py`) runs `train.finetune`; `tasks` holds the task interface and the
registry of families; `classification` is GLUE's family (sentence(-pair) classification and regression),
made of `data` (reading tasks), `model` (the classifier heads) and `metrics` (the task metrics).
"""
