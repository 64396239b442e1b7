"""Tree Transformer (Wang, Lee and Chen, EMNLP 2019, "Tree Transformer: Integrating Tree Structures into
Self-Attention"): BERT's MLM with constituent attention, which induces a binary-ish tree of every sentence
without a parser (model.attention_kind=constituent, bertjax.model.constituent; docs/models.md). And `parsed`,
`parsed_tiny`: tree attention on given parses (Nguyen, Joty, Hoi and Socher, ICLR 2020, "Tree-structured attention
with hierarchical accumulation"; model.attention_kind=tree, bertjax.model.tree_attention): MLM over the leaves of
bracketed trees the user's parser wrote, one a line (data.trees, bertjax.data.trees).

Recipe: the authors' code (github.com/yaushian/Tree-Transformer solver.py, main.py, README): 10 layers, d 512,
d_ff 2048, 8 heads, dropout 0.1, Adam 1e-4 (0.9, 0.98, eps 1e-9), gradient clip 1.5, batch 64 sentences of at
most 60 tokens, MLM only, 60k steps. Their parser reads the break probabilities of layers 9 down to 2.

  python -m bertjax.train --config=configs/tree.py:tiny --workdir=/tmp/tree-tiny          # CPU, minutes
  python -m bertjax.compress.trees --workdir=/tmp/tree-tiny --sentence="The cat sat on the mat."
  python -m bertjax.train --config=configs/tree.py:base --config.data.source=text:GLOB --workdir=W
  python -m bertjax.train --config=configs/tree.py:parsed_tiny --config.data.source=text:TREES --workdir=W

Differences from the code, all deliberate: learned positions (theirs are sinusoidal, embeddings x sqrt(d)),
BERT's post-LayerNorm (theirs is pre-LN: --config.model.norm=pre; the neighbour scores then read the layer's
normalized input through their own LayerNorm), BERT's LayerNorm (theirs divides by the unbiased std + 1e-6),
BERT's initializer (theirs Xavier uniform), and a constant learning rate without warmup is theirs (here BERT's
linear warmup and decay).
"""

from bertjax.core.config import defaults, tiny_on_demo

# name: (layers, hidden, heads, ffn). base: solver.py `_make_model(N=10, d_model=512, d_ff=2048, h=8)`.
SIZES = {
    "tiny": (3, 128, 2, 512),
    "base": (10, 512, 8, 2048),
    # parsed: the IWSLT encoder of Nguyen et al.'s code (src/models/nstack_transformer.py add_iwslt: 6 layers,
    # 512 wide, FFN 1024, 4 heads).
    "parsed_tiny": (2, 32, 2, 64),
    "parsed": (6, 512, 4, 1024),
}


def get_config(arg: str = "base"):
  """`arg` is a variant name: tiny | base."""
  if arg not in SIZES:
    raise ValueError(f"unknown tree variant {arg!r}; use one of {', '.join(SIZES)}")
  if arg.startswith("parsed"):
    return parsed(arg)
  c = defaults()
  # Run: solver.py trains 60k steps (main.py --num_step) on batches of 64 sentences (--batch_size 64).
  c.batch_size, c.seq_len = 64, 64
  c.total_steps, c.warmup_steps, c.learning_rate = 60_000, 1_000, 1e-4
  # Data: one sentence of <= 60 tokens per example (utils.py text2id(txt, 60)): packed blocks of whole sentences of
  # one document, each its own attention group with positions restarting (neighbours never cross examples).
  c.data.format = "packed"
  # Model: constituent attention in every layer, the code's neighbour scale (/256) and unnormalized rows.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.attention_kind = "constituent"
  c.model.attention = "xla"  # the prior multiplies the probabilities: no fused kernel can
  c.model.constituent_scale, c.model.constituent_renormalize = 256.0, False
  c.model.max_positions = 512
  # Objectives: MLM only (solver.py: masked_lm_loss).
  c.objectives.mlm = 1.0
  # Optimizer: solver.py: Adam(lr 1e-4, betas (0.9, 0.98), eps 1e-9), clip_grad_norm_ 1.5, no weight decay.
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "adamw", 0.9, 0.98, 1e-9
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.0, 1.5
  c.log_every, c.eval_every, c.checkpoint_every = 200, 1000, 1000  # solver.py: prints every 200, saves every 1000

  if arg == "tiny":
    tiny_on_demo(c)  # batch 32, 600 steps, vocab 2000 on the demo corpus
    c.seq_len = 64  # short rows of whole sentences, as the code's 60-token sentences
  return c


def parsed(arg: str):
  """Tree attention on given parses: the first author's IWSLT arch
  `dwnstack_merge2seq_node_iwslt_onvalue_base_upmean_mean_mlesubenc_allcross_hier` (src/models/nstack_archs.py
  L616-629) as an MLM encoder over bracketed trees (theirs is a translation encoder: its decoder is not here)."""
  c = defaults()
  # Run: runs/train_fairseq.sh: Adam (0.9, 0.98), inverse-sqrt schedule, 4000 warmup updates, lr 7e-4 (here BERT's
  # linear warmup and decay); README: 61k updates of max-tokens 1024 on 8 GPUs (about 64 trees of 16 words).
  c.batch_size, c.seq_len = 64, 128
  c.total_steps, c.warmup_steps, c.learning_rate = 61_000, 4_000, 7e-4
  # Data: one bracketed tree a line (the user's parser; theirs is Stanford CoreNLP's), leaves then nodes in a row.
  c.data.trees, c.data.format = True, "single"
  # Model: subtree mask, hierarchical embeddings (max_horiz 100, max_ver 50: the arch) and accumulation on values.
  c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = SIZES[arg]
  c.model.attention_kind, c.model.attention = "tree", "xla"  # the dense subtree mask: no fused kernel takes it
  c.model.tree_max_horiz, c.model.tree_max_vert, c.model.tree_vertical = 100, 50, "depth"
  c.model.dropout, c.model.attention_dropout = 0.3, 0.2  # README: --dropout 0.3 --attention-dropout 0.2
  # Objectives: MLM over the leaves (nodes are never masked; bertjax.train.step).
  c.objectives.mlm = 1.0
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2 = "adamw", 0.9, 0.98  # --adam-betas '(0.9, 0.98)'
  c.optimizer.clip_norm = 0.0  # CLIPNORM=0.0

  if arg == "parsed_tiny":
    tiny_on_demo(c, vocab_size=400)  # batch 32, 600 steps; a vocabulary a few hundred parsed sentences fill
    c.seq_len, c.model.dropout, c.model.attention_dropout = 64, 0.1, 0.1  # short trees; a tiny model's dropout
  return c
