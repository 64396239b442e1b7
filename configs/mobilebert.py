"""MobileBERT (Sun et al., ACL 2020, "MobileBERT: a Compact Task-Agnostic BERT for Resource-Limited Devices",
arXiv:2004.02984): a thin 24-layer BERT whose layers run inside a bottleneck (inter-block width 512, intra-block
128), with stacked feed-forward networks, NoNorm, ReLU, trigram input embeddings and an MLM decoder of
[word embeddings^T; extra output weights]; and its teacher, IB-BERT-large (inverted bottleneck: 512 between
blocks, 1024 inside).

Variants, each the released config it names (google-research/google-research mobilebert/config/*.json):
- `mobilebert`: uncased_L-24_H-128_B-512_A-4_F-4_OPT.json = the HF hub's google/mobilebert-uncased config.json.
- `tiny`: MobileBERT-tiny, uncased_L-24_H-128_B-512_A-4_F-2_tiny_OPT.json (2 FFNs, bottleneck attention, no
  shared key/query bottleneck: TF's default, where HF's class default would add an unused one).
- `ib_bert_large`: the teacher, uncased_L-24_H-1024_B-512_A-4.json over modeling.py's BertConfig defaults
  (LayerNorm, one FFN, queries, keys and values read the 512-wide input as the reference code builds them, tanh
  pooler).

  python -m bertjax.summary --config=configs/mobilebert.py:mobilebert     # params: 36597564
  python -m bertjax.summary --config=configs/mobilebert.py:ib_bert_large  # base model params: 294467840

Parameter counts (tests/test_mobilebert.py): MobileBertForPreTraining 36,597,564 and MobileBertModel 24,581,888
(released config: no pooler); MobileBERT-tiny's model 15,485,696; the teacher's model (pooler on) 294,467,840.
Training: this config is the pre-training distillation stage's shape without the teacher (MLM + NSP, LAMB at
1.5e-3, 10k warmup, 500k steps of 2,048 x 512: google-research mobilebert README and run_pretraining.py); the
progressive knowledge transfer that precedes it is `transfer`. docs/models.md (MobileBERT) has the details.

- `transfer`: the whole recipe against an IB-BERT-large teacher (run_pretraining.py with --layer_wise_warmup, then
  without): 24 phases of progressive knowledge transfer, then pre-training distillation (MLM against 0.5 one-hot
  + 0.5 teacher, plus NSP). docs/compression.md (MobileBERT's progressive transfer) says what follows the code.
- `ib_bert_tiny`: a CPU-sized IB-BERT teacher (4 layers, inter-block 64, intra-block 128) on the demo corpus.
- `tiny_transfer`: `transfer` at CPU size, a 4-layer MobileBERT student of that teacher (4 phases):

  python -m bertjax.train --config=configs/mobilebert.py:ib_bert_tiny --workdir=/tmp/ib-bert-tiny
  python -m bertjax.distill --config=configs/mobilebert.py:tiny_transfer --config.teacher=/tmp/ib-bert-tiny \
      --workdir=/tmp/mobilebert-tiny
"""

from bertjax.core.config import defaults

# name: (bottleneck (intra) width, FFNs per layer, FFN width, shared key/query bottleneck, bottleneck attention,
# norm, activation, pooler activation, hidden dropout)
VARIANTS = {
    # F-4_OPT.json: intra_bottleneck_size 128, num_feedforward_networks 4, intermediate_size 512,
    # key_query_shared_bottleneck true, use_bottleneck_attention false, normalization_type no_norm, hidden_act
    # relu, classifier_activation false, hidden_dropout_prob 0.0.
    "mobilebert": (128, 4, 512, True, False, "nonorm", "relu", False, 0.0),
    # F-2_tiny_OPT.json: num_feedforward_networks 2, use_bottleneck_attention true, key_query_shared_bottleneck
    # unset (false in modeling.py's BertConfig).
    "tiny": (128, 2, 512, False, True, "nonorm", "relu", False, 0.0),
    # H-1024_B-512_A-4.json: intra_bottleneck_size 1024, intermediate_size 4096, hidden_act gelu (TF's tanh
    # approximation: gelu_new), hidden_dropout_prob 0.1; BertConfig defaults: layer_norm, one FFN, no shared
    # bottleneck, no bottleneck attention, classifier_activation true.
    "ib_bert_large": (1024, 1, 4096, False, False, "post", "gelu_new", True, 0.1),
}


# CPU-sized variants: (the released variant whose structure they keep, inter-block width, bottleneck width, FFN
# width, embedding size, layers).
CPU_SIZES = {"ib_bert_tiny": ("ib_bert_large", 64, 128, 256, 16, 4), "tiny_transfer": ("mobilebert", 64, 32, 128, 16, 4)}
RECIPES = ("transfer", "tiny_transfer")


def get_config(arg: str = "mobilebert"):
  """`arg` is a variant name: tiny | mobilebert | ib_bert_large | transfer | ib_bert_tiny | tiny_transfer."""
  if arg in CPU_SIZES:
    return cpu_config(arg)
  if arg == "transfer":
    return transfer_recipe(get_config("mobilebert"))
  if arg not in VARIANTS:
    raise ValueError(f"unknown mobilebert variant {arg!r}; use one of {', '.join([*VARIANTS, *RECIPES, *CPU_SIZES])}")
  intra, num_ffn, ffn, qk_shared, bottleneck_attention, norm, act, pooler, dropout = VARIANTS[arg]
  c = defaults()
  # Run (README, pre-training distillation): batch 2,048 x 512, 500k steps, LAMB lr 1.5e-3, 10k warmup, linear
  # decay (end_lr_rate 1e-4: bertjax decays to 0), clip 1.0, wd 0.01.
  c.batch_size, c.seq_len = 2048, 512
  c.total_steps, c.warmup_steps, c.learning_rate = 500_000, 10_000, 1.5e-3
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "lamb", 0.9, 0.999, 1e-6
  c.optimizer.weight_decay, c.optimizer.clip_norm, c.optimizer.schedule = 0.01, 1.0, "linear"
  c.optimizer.bias_correction = False  # lamb_optimizer.py: no bias correction
  # Model: every config's shared values (vocab_size 30522, hidden_size 512 = the inter-block width, embedding_size
  # 128, trigram_input true, use_bottleneck true, 24 layers, 4 heads, max_position_embeddings 512, type_vocab_size
  # 2, attention_probs_dropout_prob 0.1, initializer_range 0.02).
  m = c.model
  m.vocab_size, m.hidden_size, m.embedding_size, m.num_layers, m.num_heads = 30522, 512, 128, 24, 4
  m.max_positions, m.type_vocab_size, m.attention_dropout, m.init_std = 512, 2, 0.1, 0.02
  m.trigram_input, m.embedding_transformation = True, True  # embedding_transformation: 3 x 128 -> 512
  m.mlm_extra_output = True  # cls/predictions/extra_output_weights (run_pretraining.py get_logits)
  m.layer, m.bottleneck_size, m.num_ffn, m.intermediate_size = "mobilebert", intra, num_ffn, ffn
  m.bottleneck_qk_shared, m.bottleneck_attention = qk_shared, bottleneck_attention
  m.norm, m.activation, m.pooler_activation, m.dropout = norm, act, pooler, dropout
  m.layer_norm_eps = 1e-12
  m.dtype = "bfloat16"
  # Objectives: MLM + NSP (MobileBertForPreTraining's heads).
  c.objectives.mlm, c.objectives.nsp = 1.0, 1.0
  c.log_every, c.eval_every, c.checkpoint_every = 100, 10_000, 10_000
  return c


def transfer_recipe(c):
  """The student config `c` with the reference's two stages against a teacher (run_pretraining.py flags in the
  google-research mobilebert README): the config's own steps are stage 2, pre-training distillation."""
  c.teacher = ""  # the IB-BERT teacher: a bertjax workdir (or an HF checkpoint directory) of the same vocabulary
  c.transfer = dict(
      stage="pd",  # set by the run: pkt (stage 1), pd (stage 2)
      student="",  # set by the run: stage 1's student, where stage 2 starts
      steps=240_000,  # --num_distill_steps 240000: 24 phases of 10,000
      learning_rate=1.5e-3,  # --learning_rate 0.0015, constant (end_lr_rate=1.0, no warmup)
      # Loss factors (README: --hidden_distill_factor 100 --attention_distill_factor 1 --beta_distill_factor 5000
      # --gamma_distill_factor 5), each divided by the number of layers (run_pretraining.py).
      hidden_factor=100.0, attention_factor=1.0, beta=5000.0, gamma=5.0,
      # all_layers: the teacher's mean and variance over the embedding output and every layer at once, as
      # run_pretraining.py computes them (teacher_hiddens); per_layer: layer l's own, as the paper describes.
      teacher_statistics="all_layers",
  )
  c.distill = dict(temperature=1.0, compare=False)  # compare: also train the student from scratch (W/baseline)
  # Stage 2: MLM against 0.5 one-hot + 0.5 teacher (--distill_ground_truth_ratio 0.5, temperature 1) = 0.5 MLM +
  # 0.5 KL(teacher || student) + a constant; NSP on ground truth.
  c.objectives.mlm, c.objectives.distill_ce_masked, c.objectives.nsp = 0.5, 0.5, 1.0
  c.model.attention = "xla"  # attention transfer reads the attention scores
  return c


def cpu_config(arg: str):
  """ib_bert_tiny (a teacher trained with python -m bertjax.train) and tiny_transfer (its student) on the demo
  corpus: configs/bert.py:tiny's recipe, float32, sized for two CPU cores."""
  from bertjax.core.config import tiny_on_demo

  base, hidden, intra, ffn, emb, layers = CPU_SIZES[arg]
  c = get_config(base)
  tiny_on_demo(c)
  m = c.model
  m.hidden_size, m.bottleneck_size, m.intermediate_size, m.embedding_size, m.num_layers = hidden, intra, ffn, emb, layers
  m.max_positions = c.seq_len
  m.attention = "xla"
  if arg == "tiny_transfer":
    c = transfer_recipe(c)
    c.transfer.steps = 200  # 4 phases of 50 steps
    c.total_steps = 200  # then 200 steps of pre-training distillation
    c.transfer.learning_rate = 2e-3  # tiny_on_demo's rate
    c.optimizer.bias_correction = False  # as the reference's LAMB
  return c
