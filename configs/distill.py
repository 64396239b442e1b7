"""Knowledge distillation of a BERT-family teacher into a smaller student (Sanh et al. 2019, DistilBERT;
Jiao et al. 2020, TinyBERT's layer losses as options).

`distilbert` is DistilBERT as published: the paper (§3) and transformers' examples/research_projects/distillation
(README's train.py command, distiller.py, scripts/extract_distilbert.py, training_configs/distilbert-base-uncased.json).
The student has the teacher's width, 6 layers copied from teacher layers [0, 2, 4, 7, 9, 11], no segment
embeddings and no pooler; its position table is the teacher's and stays frozen. Loss = 5.0 x KL of the MLM
distributions at temperature 2 over every real token (x T^2) + 2.0 x MLM + 1.0 x cosine of the final hidden
states; MLM masking 15% with 80/10/10, no NSP; AdamW betas (0.9, 0.98), eps 1e-6, no weight decay, lr 5e-4,
linear warmup over 5% then linear decay to 0, gradient clipping 5.0, batches of 4K sequences up to 512 tokens.
Tokens are chosen for masking with probability ∝ count^-0.7 (train.py --mlm_smoothing 0.7, the corpus counts
stored with the shards). Remaining differences: DistilBERT batches variable-length sequences grouped by length
and draws ceil(15% of the batch's tokens) over the whole batch; bertjax packs fixed 512-token rows and masks 15%
of each row (docs/recipes.md, "Masking by corpus counts").

  python -m bertjax.distill --config=configs/distill.py:distilbert --config.teacher=BERT_BASE_DIR --workdir=W
  python -m bertjax.train --config=configs/bert.py:tiny --workdir=/tmp/bert-tiny            # a tiny teacher
  python -m bertjax.distill --config=configs/distill.py:tiny --config.teacher=/tmp/bert-tiny --workdir=W
  python -m bertjax.summary --config=configs/distill.py:distilbert    # student params: 66985530 (DistilBertForMaskedLM)

`tiny` distils configs/bert.py:tiny (2 layers) into 1 layer on the demo corpus with DistilBERT's losses and,
with distill.compare, also trains the same student without the teacher (same data, seed, steps) and reports both.
TinyBERT's losses: --config.objectives.distill_embedding=1 --config.objectives.distill_hidden=1
--config.objectives.distill_attention=1 (a student narrower than the teacher gets TinyBERT's learned projection).
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn) of the student. distilbert: DistilBERT-base (of BERT-base).
SIZES = {
    "tiny": (1, 128, 2, 512),
    "distilbert": (6, 768, 12, 3072),
}


def get_config(arg: str = "distilbert"):
  """`arg` is a variant name: tiny | distilbert."""
  if arg not in SIZES:
    raise ValueError(f"unknown distill variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: DistilBERT's batches of up to 4K sequences (paper §3, by gradient accumulation) of up to 512 tokens
  # (train.py: the teacher tokenizer's max_model_input_sizes; longer sequences are cut into 512-token chunks).
  # Its length is 3 epochs (train.py --n_epoch 3) of English Wikipedia + Toronto Book Corpus; in steps that
  # depends on the corpus, so 100k steps here is a placeholder to set for yours.
  c.batch_size, c.seq_len = 4096, 512
  # train.py --warmup_prop 0.05 --learning_rate 5e-4.
  c.total_steps, c.warmup_steps, c.warmup_fraction, c.learning_rate = 100_000, -1, 0.05, 5e-4
  # The teacher: a bertjax workdir (a training run or an import) or an HF checkpoint directory. It must share the
  # student's vocabulary; an empty data.tokenizer takes the teacher's.
  c.teacher = ""
  c.distill = dict(
      temperature=2.0,  # softmax temperature of the soft targets (README command: --temperature 2.0)
      # Teacher layers (0-based) the student's layers start from, in order; () = every other one (0, 2, 4, ...).
      # Only for a student of the teacher's width. distilbert: extract_distilbert.py's [0, 2, 4, 7, 9, 11].
      student_layers=(),
      # Keep the student's position table as initialized (the teacher's). DistilBERT: its training config sets
      # sinusoidal_pos_embds, which makes the table requires_grad=False; extract_distilbert.py's weights then
      # overwrite its values with BERT's (the README's --freeze_pos_embs is a no-op for a DistilBERT student).
      freeze_position_embeddings=False,
      compare=False,  # also train the student without the teacher (W/baseline) and report both
  )
  # Model (the student): DistilBERT's shape, no segment embeddings (type_vocab_size 0), no pooler.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 30522, 512, 0
  c.model.dtype = "bfloat16"
  # Objectives: DistilBERT's triple loss (README: --alpha_ce 5.0 --alpha_mlm 2.0 --alpha_cos 1.0): distill_ce is
  # the KL over every real token (distiller.py without --restrict_ce_to_mask; distill_ce_masked restricts it to
  # the masked slots). TinyBERT's embedding, hidden-state and attention losses off.
  c.objectives = dict(mlm=2.0, nsp=0.0, sop=0.0, rtd=0.0, distill_ce=5.0, distill_ce_masked=0.0, distill_cos=1.0,
                      distill_embedding=0.0, distill_hidden=0.0, distill_attention=0.0)
  # Optimizer: distiller.py's torch AdamW(betas=(0.9, 0.98), eps=--adam_epsilon 1e-6), --weight_decay 0.0,
  # --max_grad_norm 5.0, get_linear_schedule_with_warmup (decay over the steps after warmup).
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.98, 1e-6
  c.optimizer.weight_decay, c.optimizer.clip_norm, c.optimizer.schedule = 0.0, 5.0, "linear_after_warmup"
  # torch AdamW corrects Adam's bias; distiller.py's no_decay = ["bias", "LayerNorm.weight"] (which misses the
  # student's sa_layer_norm / output_layer_norm weights; moot at weight decay 0).
  c.optimizer.bias_correction, c.optimizer.decay_mask = True, "bert"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 5_000, 5_000

  if arg == "distilbert":
    c.distill.student_layers = (0, 2, 4, 7, 9, 11)  # scripts/extract_distilbert.py
    c.distill.freeze_position_embeddings = True  # see distill.freeze_position_embeddings above
    # Masking: 15%, 80/10/10 (train.py --mlm_mask_prop 0.15 --word_mask 0.8 --word_keep 0.1 --word_rand 0.1), a
    # token chosen with probability ∝ max(count, 1)^-0.7 (--mlm_smoothing 0.7; XLM's rare-word emphasis).
    c.masking.scheme, c.masking.smoothing = "token", 0.7
  if arg == "tiny":  # configs/bert.py:tiny's recipe and corpus (its teacher's), 1 of its 2 layers
    tiny_on_demo(c)
    c.total_steps = 300  # half the teacher's 600: both runs of distill.compare stay CPU-sized
    c.distill.compare = True
  return c
