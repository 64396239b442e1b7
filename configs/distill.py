"""Knowledge distillation of a BERT-family teacher into a smaller student (Sanh et al. 2019, DistilBERT;
Jiao et al. 2020, TinyBERT's layer losses as options).

Recipe (DistilBERT paper §3 and transformers' examples/research_projects/distillation README + train.py):
the student has the teacher's width, half its layers (initialized from every other teacher layer), no
segment embeddings and no pooler; loss = 5.0 x soft-target KL at temperature 2 + 2.0 x MLM + 1.0 x cosine
of the final hidden states (--alpha_ce 5.0 --alpha_mlm 2.0 --alpha_cos 1.0 --temperature 2.0); MLM masking
15% with 80/10/10, no NSP; Adam lr 5e-4, eps 1e-6, no weight decay, warmup 5%, gradient clipping 5.0, batches
of 4K examples. Differences: DistilBERT freezes the position embeddings (--freeze_pos_embs) and batches by
length; bertjax trains them and uses fixed-length rows.

  python -m bertjax.distill --config=configs/distill.py:distilbert --config.teacher=BERT_BASE_DIR --workdir=W
  python -m bertjax.train --config=configs/bert.py:tiny --workdir=/tmp/bert-tiny            # a tiny teacher
  python -m bertjax.distill --config=configs/distill.py:tiny --config.teacher=/tmp/bert-tiny --workdir=W
  python -m bertjax.summary --config=configs/distill.py:distilbert    # params: 66985530 (DistilBertForMaskedLM)

`tiny` distils configs/bert.py:tiny (2 layers) into 1 layer on the demo corpus and, with distill.compare,
also trains the same student without the teacher (same data, seed, steps) and reports both.
TinyBERT's losses: --config.objectives.distill_hidden=1 --config.objectives.distill_attention=1.
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
  # Run: DistilBERT's batch of 4K sequences; its length in steps is not published (3 epochs over English
  # Wikipedia + Toronto Book Corpus), 100k steps here is a placeholder to set for your corpus.
  c.batch_size, c.seq_len = 4096, 128
  c.total_steps, c.warmup_steps, c.warmup_fraction, c.learning_rate = 100_000, -1, 0.05, 5e-4
  # The teacher: a bertjax workdir (a training run or an import) or an HF checkpoint directory. It must share
  # the student's vocabulary; an empty data.tokenizer takes the teacher's.
  c.teacher = ""
  c.distill = dict(
      temperature=2.0,  # softmax temperature of the soft targets (DistilBERT: 2.0)
      compare=False,  # also train the student without the teacher (W/baseline) and report both
  )
  # Model (the student): DistilBERT's shape, no segment embeddings (type_vocab_size 0), no pooler.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 30522, 512, 0
  c.model.dtype = "bfloat16"
  # Objectives: DistilBERT's triple loss (alpha_ce 5.0, alpha_mlm 2.0, alpha_cos 1.0); TinyBERT's layer losses off.
  c.objectives = dict(mlm=2.0, nsp=0.0, sop=0.0, rtd=0.0, distill_ce=5.0, distill_cos=1.0, distill_hidden=0.0,
                      distill_attention=0.0)
  # Optimizer: Adam, eps 1e-6, no weight decay, clipping 5.0 (train.py defaults), linear decay after warmup.
  c.optimizer.name, c.optimizer.eps, c.optimizer.weight_decay, c.optimizer.clip_norm = "adamw", 1e-6, 0.0, 5.0
  c.optimizer.schedule = "linear"
  c.optimizer.bias_correction, c.optimizer.decay_mask = True, "bert"  # distiller.py: torch AdamW, no_decay bias/LayerNorm.weight
  c.log_every, c.eval_every, c.checkpoint_every = 100, 5_000, 5_000

  if arg == "tiny":  # configs/bert.py:tiny's recipe and corpus (its teacher's), 1 of its 2 layers
    tiny_on_demo(c)
    c.total_steps = 300  # half the teacher's 600: both runs of distill.compare stay CPU-sized
    c.distill.compare = True
  return c
