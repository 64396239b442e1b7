"""Fine-tuning pretrained encoders on sentence(-pair) classification and regression (GLUE task shapes).

`python -m bertjax.finetune` (`__main__.py`) runs `train.finetune`; `data` reads tasks, `model` holds the
classifier heads, `metrics` the task metrics.
"""
