"""Pretraining: the pure train/eval steps, the model factory, optimizer, checkpoints, the loop that runs them and
its metric writer, and the step-time benchmark. `python -m bertjax.train` (train/__main__.py) runs the loop."""
