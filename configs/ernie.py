"""ERNIE 1.0 (Sun et al. 2019, arXiv 1904.09223): BERT whose MLM masks whole entities and phrases ("knowledge
masking"): a unit is an entity or phrase from data.units, or else a word.

Masking is ERNIE's own `mask()` (PaddlePaddle/ERNIE ernie/batching.py @830e2b7, `masking.scheme=ernie`): a draw
per unit, selected iff <= 0.15, 80/10/10 per token, every token of a selected unit predicted; the slots are a
static budget here, and units that do not fit are cut and counted (train/units_cut beside train/units_masked).
Units come from a span source (bertjax.data.units): `conll:PATH` (WikiANN, CoNLL-2003 style) or `jsonl:PATH`
(character spans per document). `data.source=units` trains on the span source's own sentences; another source
(`text:GLOB`) gets its mentions from a gazetteer of the span source's strings. Choices and differences:
docs/models.md (ERNIE).

  python -m bertjax.train --config=configs/ernie.py:tiny --config.data.units=conll:../shared/data/ner/wikiann-en --workdir=/tmp/ernie-tiny
  python -m bertjax.summary --config=configs/ernie.py:base      # params: BERT-base's shape
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base: ERNIE 1.0's BERT-base shape (paper §4: "the same model size as
# BERT-base", 12 layers, 768 hidden, 12 heads); tiny is for CPU.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base."""
  if arg not in SIZES:
    raise ValueError(f"unknown ernie variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: ernie/pretrain_args.py (@830e2b7): num_train_steps 1,000,000, learning_rate 1e-4, warmup_steps 5000,
  # max_seq_len 512. Its batch is counted in tokens (--in_tokens); 256 x 512 here is BERT's [R: the published
  # Chinese run's batch is not in the code].
  c.batch_size, c.seq_len = 256, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 5_000, 1e-4
  # Data: the sentences of the span source itself (WikiANN's are single Wikipedia sentences without document
  # order, so rows are packed full sentences, RoBERTa's FULL-SENTENCES, and there is no NSP); data.units must
  # name the spans. A text corpus with a gazetteer: --config.data.source=text:GLOB.
  c.data.source, c.data.format = "units", "full_sentences"
  # Masking: ERNIE's mask() over the units: 15% of the units, 80/10/10 per token (batching.py: base_prob 0.15,
  # thresholds 0.2 and 0.1 of it). ERNIE predicts every selected token (no cap); the slots here are 25% above
  # ceil(0.15 x 512) = 77, so that few rows overflow (those cut are logged).
  c.masking.scheme, c.masking.units, c.masking.mask_prob = "ernie", True, 0.15
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  c.masking.max_predictions = 96
  # Model: BERT-base (paper §4) on a WordPiece-size vocabulary [R: ERNIE 1.0's Chinese vocabulary is 18k ids; an
  # English run uses BERT's 30522].
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 30522, 512, 2
  c.model.dtype = "bfloat16"
  # Objectives: MLM only (knowledge masking; the dialogue-LM task needs dialogue data and is left out).
  c.objectives.mlm = 1.0
  # Optimizer: pretrain_args.py: weight_decay 0.01, lr_scheduler linear_warmup_decay (ernie/optimization.py:
  # linear warmup, then linear decay to 0 over num_train_steps), AdamW with BERT's no-decay names.
  c.optimizer.name, c.optimizer.b2, c.optimizer.weight_decay = "adamw", 0.999, 0.01
  c.optimizer.schedule, c.optimizer.decay_mask = "linear", "bert"
  c.log_every, c.eval_every, c.checkpoint_every = 10, 1000, 10_000  # pretrain_args.py: skip_steps 10, validation_steps 1000

  if arg == "tiny":
    tiny_on_demo(c)  # seq 128, batch 32, 600 steps, vocab 2000 (SentencePiece trained on the span source's text)
    c.masking.max_predictions = 24  # ceil(0.15 x 128) = 20, plus 25% (see above)
  return c
