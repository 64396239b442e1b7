"""Interoperability with HF transformers checkpoints: safetensors I/O, config and weight mapping, tokenizers,
import/export of workdirs (convert, workdir), continued pretraining from a checkpoint (init_from), the one
inference module (inference), and `python -m bertjax.hf` (__main__)."""
