"""WKLM (Xiong, Du, Wang, Stoyanov, ICLR 2020, "Pretrained Encyclopedia"): BERT trained to tell the entity
mentions of a text from mentions replaced by another entity of the same type, plus MLM at a lower rate.

Data preparation corrupts the text (bertjax.data.units.corrupt): each mention is replaced with probability 1/2 by
the string of another mention of its type from the same work unit, never two adjacent mentions, never by the
same string; the rows keep each mention's boundaries. The wklm objective (bertjax.objectives.wklm) scores
sigma(w . [h_first; h_last] + b) per mention with BCE (1: original); MLM masks 5% of the tokens and never a
mention token. Types come from the span source (WikiANN: PER/ORG/LOC; a JSONL corpus: its own tags); the paper
uses Wikidata's types of linked entities. No author code was found: values marked [R] are from the paper as
recalled, not checked against a primary source. Choices and differences: docs/models.md (WKLM).

  python -m bertjax.train --config=configs/wklm.py:tiny --config.data.units=conll:../shared/data/ner/wikiann-en --workdir=/tmp/wklm-tiny
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base: BERT-base, the paper's starting point [R]; tiny is for CPU.
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base."""
  if arg not in SIZES:
    raise ValueError(f"unknown wklm variant {arg!r}; use one of {', '.join(SIZES)}")
  c = defaults()
  # Run: continued pretraining of BERT-base (set --config.init_from=hf:DIR for bert-base-uncased) for about 1M
  # updates [R]; batch and sequence length are BERT's here [R: to check against the paper].
  c.batch_size, c.seq_len = 256, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 1_000_000, 10_000, 1e-4
  # Data: the span source's own sentences (spec sheet §6(e): WikiANN's spans come from Wikipedia anchors, as
  # the paper's mentions do), packed as full sentences; another source gets mentions from a gazetteer.
  c.data.source, c.data.format = "units", "full_sentences"
  # WKLM: "we replace ... with probability 0.5" and "never replace two adjacent entities" [R: spec sheet §6(b)];
  # mention slots: seq_len // 4 (128 at 512; WikiANN averages ~1.4 mentions per 24-token sentence).
  c.wklm.replace_prob, c.wklm.max_mentions = 0.5, 0
  # Masking: MLM at 5% (the paper's ratio, spec sheet §6(b)), 80/10/10, kept off mentions.
  c.masking.scheme, c.masking.mask_prob = "token", 0.05
  c.masking.mask_token_prob, c.masking.random_token_prob = 0.8, 0.1
  # Model: BERT-base.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.vocab_size, c.model.max_positions, c.model.type_vocab_size = 30522, 512, 2
  c.model.dtype = "bfloat16"
  # Objectives: L = L_ent + L_MLM, equal weights (spec sheet §6(b)).
  c.objectives.mlm, c.objectives.wklm = 1.0, 1.0
  # Optimizer: BERT's AdamW recipe (configs/bert.py), linear decay.
  c.optimizer.name, c.optimizer.b2, c.optimizer.weight_decay = "adamw", 0.999, 0.01
  c.optimizer.schedule, c.optimizer.decay_mask = "linear", "bert"
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000

  if arg == "tiny":
    tiny_on_demo(c)  # seq 128 (32 mention slots, 7 MLM slots), batch 32, 600 steps, vocab 2000
  return c
