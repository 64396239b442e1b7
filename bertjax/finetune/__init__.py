"""Fine-tuning pretrained encoders: the shared machinery and one package per task family.

Shared: `train` (the trainer; `python -m bertjax.finetune` runs `train.finetune`), `batches` ((seed, step)-pure
batches, length buckets, packing), `tasks` (the task interface and the registry families join), `model`
(pretrained init, saved params, layer-wise decay), `task_models` (task models on disk, for every family),
`predict` (`python -m bertjax.finetune.predict`, every family) and `suite` (the GLUE table).
Families, each a package that registers itself with `tasks`: `classification`, `squad`, `tagging`,
`multiple_choice` (docs/finetune_tasks.md).
"""
