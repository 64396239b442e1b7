"""The run config's common skeleton, the checks of the run's own keys, and the values derived from it (never
stored twice). It imports nothing above the core: the model, masking, objectives, optimizer and data sections
are each checked by the code that owns their values, and bertjax.train.build.validate runs every check.

configs/*.py start from `defaults()` and set their paper's recipe; every key is overridable from the
command line (`--config.model.hidden_size=256`). Objective weights of 0 switch an objective off, so any
combination is a command-line change: `--config.objectives.sop=1 --config.objectives.nsp=0`.
"""

import dataclasses
import math

import jax.numpy as jnp
import ml_collections

from bertjax.core.errors import UserError

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Run.
  c.seed = 0  # every random choice (data order, pairs, masks, dropout, sampling) derives from it
  c.batch_size = 256  # global batch, split over processes and devices
  c.seq_len = 128  # tokens per example
  c.total_steps = 1_000_000  # of the whole run, every phase included
  c.warmup_steps = 10_000  # -1: warmup_fraction x total_steps, so that changing total_steps keeps the shape
  c.warmup_fraction = 0.0
  c.learning_rate = 1e-4  # peak
  # Training phases, run in order by one command (`phase(...)` makes one; see `phases`). Empty: one phase of
  # seq_len x batch_size for total_steps. Parameters and optimizer state carry across a boundary.
  c.phases = ()
  c.grad_accum_steps = 1  # microbatches per step (lax.scan inside the step)
  c.sharding = "dp"  # dp | fsdp | fsdp_tp (bertjax.core.sharding.PRESETS)
  c.mesh = dict(data=0, fsdp=0, tensor=0)  # mesh axis sizes; 0 keeps the preset's
  c.sharding_rules = ""  # explicit rules replacing the preset's: "embed=fsdp,mlp=tensor,activation_batch=data+fsdp"
  c.init_from = ""  # a checkpoint to take weights from (a new run), not a resume
  c.overwrite = False  # allow a workdir holding another config's run to be replaced
  # Data.
  c.data = dict(
      source="demo",  # demo | text:GLOB | tfds:NAME[:SPLIT] | shards:DIR (written by python -m bertjax.data.prepare)
      tokenizer="",  # spm:PATH | wordpiece:PATH[:cased]; empty: train SentencePiece on the source (shards: theirs)
      split_paragraphs=False,  # text: split each line into sentences (a paragraph per line)
      format="auto",  # auto (nsp/sop from the objectives, else single) | electra | single | full_sentences | packed
      tokenizer_model="unigram",  # SentencePiece trained on the source: unigram | bpe
      tokenizer_sentences=1_000_000,  # sentences sampled to train it (SentencePiece holds them in memory)
      tokenizer_max_sentence_length=4192,  # longer sentences (UTF-8 bytes) are left out of that sample
      tfds_text_key="text",  # tfds: the feature holding the document's text
      tfds_data_dir="",  # tfds: data_dir (e.g. gs://tfds-data/datasets); empty: tfds's default
      eval_fraction=0.1,  # documents held out for eval
      short_seq_prob=0.1,  # BERT: share of pair instances with a shorter random target length (electra: 0.05)
      dupe_factor=5,  # passes over the corpus with different pairings
      cache_dir="",  # where sources other than shards: are prepared once; empty: $BERTJAX_CACHE or ~/.cache/bertjax
      prepare_workers=0,  # processes preparing a source into the cache (0: in this one; big corpora: bertjax.data.prepare)
      prepare_wait_s=86400.0,  # how long a process waits for another (process 0) to prepare a cache entry
      # Shard files are checked against metadata.json before training reads them: size (always), and sha256:
      # first (once per file state, recorded in the cache) | full (every start) | size (never).
      verify="first",
      # Entity/phrase spans (bertjax.data.units): conll:PATH | jsonl:PATH; rows then carry unit_start (ERNIE's
      # units) and mention (WKLM). With source=units the corpus is the span source's own text; with another
      # source the span source's mention strings mark mentions in it (a gazetteer).
      units="",
      trees=False,  # each text line is a bracketed tree, (S (NP a b) c): rows of leaves, then nodes (data.trees)
      # XLNet's permutation LM (objective plm, bertjax.data.plm): the permutation block (0: model.xlnet.reuse_len), the
      # targets per row (0: seq_len x mask_beta / mask_alpha), the span sampling's mask_beta of every mask_alpha tokens.
      perm_size=0, num_predict=0, mask_alpha=6.0, mask_beta=1.0,
  )
  # Masking.
  c.masking = dict(
      scheme="token",  # token | whole_word | ngram | span
      mask_prob=0.15,
      max_predictions=0,  # MLM slots per example (the budget); 0: ceil(seq_len x mask_prob)
      eval_mask_prob=0.0,  # masking rate of the eval batches; 0: mask_prob (ModernBERT trains at 30%, evaluates at 15%)
      mask_token_prob=0.8,  # of the chosen tokens: share replaced by [MASK]
      random_token_prob=0.1,  # ... by a random token (the rest stay as they are)
      replace_dist="uniform",  # random tokens: uniform over the vocabulary (BERT) | unigram: by corpus count (SpanBERT)
      smoothing=0.0,  # token scheme: p(choose a token) ~ count^-smoothing (DistilBERT's mlm_smoothing 0.7); 0: uniform
      max_ngram=3,  # ngram scheme
      span_p=0.2,  # span scheme: geometric parameter
      max_span=10,  # span scheme: longest span in words
      wso_share=0.05,  # objective wso: share of the unmasked trigrams shuffled (StructBERT: 5%)
      units=False,  # whole_word/ngram/span/ernie over data.units' units (unit_start) instead of words
  )
  # Model.
  c.model = dict(
      vocab_size=30522,
      hidden_size=768,
      num_layers=12,
      num_heads=12,
      intermediate_size=3072,
      embedding_size=0,  # E; 0 = hidden_size (no factorization)
      max_positions=512,
      type_vocab_size=2,
      dropout=0.1,
      attention_dropout=0.1,
      # Dropout masks' generator (bertjax.model.dropout): auto (lowbias32 on the CPU, where it is measured faster:
      # docs/cpu.md; threefry elsewhere) | threefry (the reference: jax.random's hash) | lowbias32.
      dropout_rng="auto",
      layer_norm_eps=1e-12,
      init_std=0.02,
      sharing="none",  # none | all | attention | ffn (ALBERT cross-layer sharing)
      num_hidden_groups=1,  # ALBERT: distinct parameter sets of the shared blocks
      generator_fraction=0.0,  # ELECTRA: generator width as a fraction of the discriminator's
      sample_temperature=1.0,  # ELECTRA: generator sampling temperature
      dtype="float32",  # compute dtype: float32 | bfloat16 (params stay float32)
      remat="none",  # none | full | dots | dots_no_batch
      scan_unroll=0,  # layers per scan iteration (0: automatic: all on CPU, else up to 4); aot's estimate unrolls copies
      activation="gelu",  # gelu (exact) | gelu_new (tanh approximation; some HF checkpoints)
      position_offset=0,  # first position id (RoBERTa checkpoints: 2)
      # auto | xla | dot_product | cudnn | splash (bertjax.model.attention). auto: cuDNN flash attention on
      # GPU, splash on TPU, xla on CPU; fused kernels need attention_dropout=0, else auto keeps xla.
      attention="auto",
      head_size=0,  # width of one attention head; 0: hidden_size / num_heads (a head-pruned model sets it)
      # Kinds of the encoder's parts (bertjax.model.kinds; docs/layout.md adds one); these defaults are BERT's.
      attention_kind="mha",  # mha (multi-head dot-product, global or local per layer) | lsra | a registered kind
      # Long-short range attention (attention_kind=lsra, Lite Transformer; bertjax.model.lsra, docs/models.md).
      lsra_kernel_sizes="",  # convolution kernel per layer, "3,7,15,31,31,31" (one value: all); "": 3,7,15 then 31
      lsra_conv="dynamic",  # dynamic (kernels predicted per position) | lightweight (one softmaxed kernel per head)
      lsra_glu=True,  # GLU after the convolution branch's input Linear (the reference's encoder_glu)
      lsra_weight_dropout=-1.0,  # DropConnect on the convolution kernels; < 0: model.attention_dropout
      # Reformer's attentions (transformers' ReformerConfig names; bertjax.model.chunked, .lsh, .per_layer).
      attn_layers="",  # attention_kind=per_layer: each layer's attention kind, "local,lsh" (repeated over the layers)
      causal=False,  # local, lsh: a query reads no later key (transformers' is_decoder)
      local_attn_chunk_length=64,  # local: tokens per chunk
      local_num_chunks_before=1, local_num_chunks_after=0,  # local: neighbouring chunks read (circularly) before/after
      local_attention_dropout=-1.0,  # local: dropout of the attention probabilities; < 0: model.attention_dropout
      lsh_attn_chunk_length=64, lsh_num_chunks_before=1, lsh_num_chunks_after=0,  # lsh: the same, in sorted rows
      lsh_attention_dropout=-1.0,  # lsh: < 0: model.attention_dropout
      num_hashes=1,  # lsh: hash rounds, combined by their logsumexp
      num_buckets="",  # lsh: "64" or factors "8,16"; "": transformers' 2^floor(log2(2 seq_len / chunk)) rule
      hash_seed=-1,  # lsh: >= 0: the same random rotations in every layer and step (transformers' hash_seed)
      # ModernBERT-class encoders (docs/modernbert.md).
      position="learned",  # learned (absolute table) | rope (rotary positions from position_ids, no table)
      rope_theta=160_000.0,  # RoPE base of global-attention layers
      local_rope_theta=10_000.0,  # RoPE base of local (sliding-window) layers
      ffn="mlp",  # mlp | geglu (gated: intermediate_size is the width of each of the two halves)
      norm="post",  # post (BERT) | pre (LN before each block, first layer's attention LN skipped, final LN)
      use_bias=True,  # biases of the encoder's dense layers, LayerNorms and MLM transform (the decoder keeps its own)
      local_window=0,  # window of local layers (tokens at most local_window // 2 away are seen); 0: all global
      global_every=1,  # with local_window: layer i is global when i % global_every == 0, else local
      layer_types="",  # explicit per-layer pattern overriding global_every: "global,local,local,..."
      init="bert",  # bert (truncated normal init_std) | modernbert (output projections' std / sqrt(2 x layers))
      # Dense weight gradients: xla (autodiff) | transposed (x^T materialized first, so XLA:CPU's YNNPACK takes
      # them; bertjax.model.layers.matmul_pretransposed). Same gradients; a CPU speed switch (docs/cpu.md).
      dense_grad="xla",
      # MobileBERT-class encoders (docs/models.md, MobileBERT; configs/mobilebert.py).
      layer="bert",  # bert | mobilebert (bottleneck in, attention, num_ffn FFNs, bottleneck out; bertjax.model.mobilebert)
      bottleneck_size=0,  # mobilebert: intra-bottleneck width (the blocks inside the bottleneck run at it)
      bottleneck_qk_shared=False,  # mobilebert: queries and keys from one shared bottleneck of the layer input
      bottleneck_attention=False,  # mobilebert: queries, keys and values from the input bottleneck (MobileBERT-tiny)
      num_ffn=1,  # mobilebert: feed-forward networks stacked in one layer
      trigram_input=False,  # embeddings: [next; current; previous] word embeddings (never across packed examples)
      embedding_transformation=False,  # embeddings: E (3E) -> H before H-wide position/type tables and the norm
      mlm_extra_output=False,  # MLM head: H -> H transform, decoder [word embeddings^T; extra output weights]
      pooler_activation=True,  # sentence head: tanh pooler over [CLS]; False: [CLS]'s state (HF classifier_activation)
      reversible=True,  # layer=reformer (docs/models.md, Reformer): custom-VJP reversible stack; False: autodiff, model.remat
      chunk_size_feed_forward=0,  # layer=reformer: FFN over chunks of this many positions (0: all at once)
      # position=axial: (d1, d2) with d1 x d2 = the training seq_len, widths (e1, e2) of its two tables (summing to
      # the embedding width), the std of their normal init.
      axial_pos_shape=(), axial_pos_embds_dim=(), axial_norm_std=1.0,
      mlm_decoder="tied",  # tied (BERT: transform, word embeddings^T) | untied (Reformer: Linear(2H -> V) + bias)
      # Tree Transformer (attention_kind=constituent; docs/models.md): the neighbour scores' divisor (256: the
      # authors' code, whatever the width; 0: the hidden width), and whether C x softmax rows are renormalized.
      constituent_scale=256.0,
      constituent_renormalize=False,  # False: the code's unnormalized rows; True: rows sum to 1
      # Complex-order embeddings (position=complex_order): descending (the code: S-1 .. 0 along the row) |
      # ascending (the paper: the token's position, restarting per packed example).
      complex_positions="descending",
      # Tree attention on given parses (attention_kind=tree; docs/models.md): the hierarchical embeddings' index clamps
      # (the code's, 100 and 1024), the vertical index: depth (the code's: below the root) | path (the paper's).
      tree_max_horiz=100, tree_max_vert=1024, tree_vertical="depth",
  )
  # Objectives: name -> weight; 0 switches one off.
  c.objectives = dict(mlm=1.0, nsp=0.0, sop=0.0, rtd=0.0, sbo=0.0, wso=0.0, sso=0.0, wklm=0.0, plm=0.0)
  # WKLM's entity replacement (objective wklm; configs/wklm.py): share of mentions replaced in data preparation,
  # and the mention slots per example (a static shape; 0: seq_len // 4).
  c.wklm = dict(replace_prob=0.5, max_mentions=0)
  # Optimizer.
  c.optimizer = dict(
      name="adamw",  # adamw | lamb
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,  # decoupled; on the parameters decay_mask names
      clip_norm=1.0,  # global gradient norm
      bias_correction=True,  # Adam's 1 - b^t correction (torch/transformers, NVIDIA LAMB); False: google-research/bert's
      decay_mask="bert",  # bert: no decay on biases and LayerNorm | all: every parameter (fairseq)
      schedule="linear",  # linear (BERT/ALBERT) | linear_after_warmup (RoBERTa) | electra | cosine | poly_sqrt | wsd: bertjax.train.optim
      decay_fraction=0.2,  # wsd: share of total_steps in the final 1-sqrt decay (Hägele et al. 2024: 20%)
  )
  # Logging, checkpoints, eval.
  c.log_every = 100
  c.eval_every = 1000
  c.eval_batch_size = 0  # 0 = batch_size
  c.checkpoint_every = 10_000
  c.keep_checkpoints = 3
  c.max_nonfinite_steps = 10  # stop (saving the last good state) after this many skipped steps in a row
  c.startup_timeout = 300.0  # seconds joining a multi-process job, and then the start-up all-reduce, may take
  c.heartbeat_timeout = 100.0  # multi-process: seconds a silent process may go before the others stop (jax's default)
  c.runtime = dict(
      # Multi-process: seconds a collective may wait for its peers before this process stops with one line and
      # exit 75 (restartable), naming the step and the peer that did not come (bertjax.core.runtime: XLA:CPU's own
      # collective timeout). A restarted run scales it down to 50x the step time it measured, 300 s at least.
      step_timeout_s=1200.0,
  )
  return c


def active_objectives(config) -> dict:
  """The objectives with a nonzero weight, in a fixed order."""
  return {k: float(v) for k, v in sorted(config.objectives.items()) if v}


def phase(fraction: float, **values) -> dict:
  """One entry of config.phases: its `fraction` of total_steps (the last phase ends at total_steps) and, where
  nonzero, its own seq_len, batch_size and max_predictions (else the run's), and learning_rate: a phase with a
  learning rate restarts the schedule (optimizer.schedule over the phase's steps, peak learning_rate, warmup
  warmup_fraction of them; NVIDIA's LAMB recipe), one without continues the run's (BERT's 128 -> 512)."""
  entry = dict(fraction=fraction, seq_len=0, batch_size=0, max_predictions=0, learning_rate=0.0, warmup_fraction=0.0)
  unknown = set(values) - set(entry)
  if unknown:
    raise UserError(f"unknown phase keys {sorted(unknown)}; use {', '.join(entry)}")
  return dict(entry, **values)


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, end) of a run, and the run's config as this phase trains it (its seq_len, batch_size and
  masking.max_predictions in place): what data, steps and summaries are built from."""

  index: int
  start: int
  end: int
  learning_rate: float  # 0: the run's schedule continues through the phase
  warmup_fraction: float
  config: ml_collections.ConfigDict

  @property
  def steps(self) -> int:
    return self.end - self.start

  @property
  def warmup_steps(self) -> int:
    """Warmup of a phase that restarts the schedule: warmup_fraction of its steps."""
    return int(round(self.warmup_fraction * self.steps))


def phases(config) -> list:
  """The run's phases (one, the config itself, when config.phases is empty)."""
  if not config.phases:
    return [Phase(0, 0, config.total_steps, 0.0, 0.0, config)]
  out, done, start = [], 0.0, 0
  for i, p in enumerate(config.phases):
    done += p["fraction"]
    end = config.total_steps if i == len(config.phases) - 1 else int(round(done * config.total_steps))
    c = config.copy_and_resolve_references()
    c.seq_len = p["seq_len"] or config.seq_len
    c.batch_size = p["batch_size"] or config.batch_size
    c.masking.max_predictions = p["max_predictions"] or config.masking.max_predictions
    out.append(Phase(i, start, end, p["learning_rate"], p["warmup_fraction"], c))
    start = end
  return out


def configs_by_seq_len(config) -> dict:
  """seq_len -> the config of the first phase training at it: the rows (prepared data) depend on a phase's
  seq_len only, so the loop and `prepare` make one dataset per entry."""
  out = {}
  for p in phases(config):
    out.setdefault(p.config.seq_len, p.config)
  return out


def phase_at(config, step: int) -> Phase:
  """The phase that trains step `step` (0-based; the last phase for step == total_steps)."""
  plan = phases(config)
  return next((p for p in plan if p.start <= step < p.end), plan[-1])


def phase_config(config, number: int = 0) -> ml_collections.ConfigDict:
  """Phase `number`'s config (1-based), for the CLIs that compile or time one shape (aot, bench: --phase).
  0: the phase trained at config.seq_len (so `--config.seq_len=512` picks BERT's second phase), or, where no
  phase is, the run's own shapes as given."""
  plan = phases(config)
  if number == 0:
    at_seq_len = [p for p in plan if p.config.seq_len == config.seq_len]
    if at_seq_len:
      return at_seq_len[0].config
    one = config.copy_and_resolve_references()
    one.phases = ()
    return one
  if not 1 <= number <= len(plan):
    raise UserError(f"--phase={number}, but the config has {len(plan)} phase{'s' if len(plan) > 1 else ''}; "
                    f"use 1..{len(plan)}, or 0 for the phase at --config.seq_len")
  return plan[number - 1].config


def warmup_steps(config) -> int:
  return config.warmup_steps if config.warmup_steps >= 0 else int(round(config.warmup_fraction * config.total_steps))


def max_predictions(config) -> int:
  """The MLM slots gathered per example (static shape): masking.max_predictions, or `mlm_slots`."""
  return config.masking.max_predictions or mlm_slots(config.seq_len, config.masking.mask_prob)


def eval_mask_prob(config) -> float:
  """The masking rate of eval batches: masking.eval_mask_prob, or the training rate."""
  return config.masking.get("eval_mask_prob", 0.0) or config.masking.mask_prob


def eval_max_predictions(config) -> int:
  """The MLM slots of an eval example: the training budget when eval masks at the training rate, else
  ceil(seq_len x eval_mask_prob) (never more than the training budget: a config's explicit
  max_predictions caps both)."""
  if eval_mask_prob(config) == config.masking.mask_prob:
    return max_predictions(config)
  slots = mlm_slots(config.seq_len, eval_mask_prob(config))
  return min(slots, config.masking.max_predictions) if config.masking.max_predictions else slots


def mlm_slots(seq_len: int, mask_prob: float) -> int:
  """The number of gathered MLM slots, derived once from seq_len and mask_prob (BERT: 128 -> 20)."""
  return int(math.ceil(seq_len * mask_prob))


def check(ok: bool, message: str):
  """Raises UserError(message) unless `ok`: the one-line form every config check takes."""
  if not ok:
    raise UserError(message)


def names_list(text) -> tuple:
  """A comma-separated config value ("local,lsh"; "" is empty) as a tuple of stripped names."""
  return tuple(t.strip() for t in str(text).split(",") if t.strip())


def ints_list(text, key: str) -> tuple:
  """A comma-separated config value of integers ("8,16"; "" is empty) as a tuple; else a UserError naming `key`."""
  try:
    return tuple(int(t) for t in names_list(text))
  except ValueError:
    raise UserError(f"{key}={text!r} must be integers separated by commas, e.g. 8,16") from None


def validate(config):
  """Checks the run's own keys (scalars, warmup, phases and their shapes); raises UserError with the fix on the
  first problem. Each part of the config is checked by the code that owns its values (model, masking,
  objectives, optimizer, data); bertjax.train.build.validate runs them all."""
  check(config.warmup_steps <= config.total_steps,
        f"warmup_steps={config.warmup_steps} exceeds total_steps={config.total_steps}; lower --config.warmup_steps, "
        "or give warmup as a share of the run: --config.warmup_steps=-1 --config.warmup_fraction=0.1")
  check(config.warmup_steps >= -1, f"warmup_steps={config.warmup_steps}; use >= 0, or -1 for warmup_fraction")
  check(0 <= config.warmup_fraction < 1, f"warmup_fraction={config.warmup_fraction} must be in [0, 1)")
  check(config.masking.max_predictions >= 0,
        f"masking.max_predictions={config.masking.max_predictions}; use >= 1, or 0 for ceil(seq_len x mask_prob)")
  _validate_phases(config)
  for key in ("log_every", "eval_every", "checkpoint_every", "total_steps", "batch_size", "max_nonfinite_steps"):
    check(config[key] > 0, f"{key}={config[key]} must be positive")


def _validate_phases(config):
  """config.phases' entries, and the shapes (seq_len, batch, masking budget) of every phase."""
  for i, p in enumerate(config.phases):
    check(isinstance(p, dict) and set(p) == set(phase(1.0)),
          f"phases[{i}] is {p!r}; make each phase with bertjax.core.config.phase(fraction, ...)")
    check(p["fraction"] > 0 and p["learning_rate"] >= 0 and 0 <= p["warmup_fraction"] < 1,
          f"phases[{i}]: fraction must be > 0, learning_rate >= 0 and warmup_fraction in [0, 1); got {p!r}")
  if config.phases:
    total = sum(p["fraction"] for p in config.phases)
    check(abs(total - 1) < 1e-6, f"the phases' fractions add up to {total:g}, not 1; fix --config.phases[i].fraction")
  for ph in phases(config):
    key = (lambda k, run_key: run_key) if not config.phases else (lambda k, run_key: f"phases[{ph.index}].{k}")
    c, m = ph.config, ph.config.model
    check(ph.steps >= 1, f"phase {ph.index + 1} has no steps at total_steps={config.total_steps}; raise "
          f"--config.total_steps or --config.{key('fraction', '')}")
    check(c.seq_len + m.position_offset <= m.max_positions,
          f"{key('seq_len', 'seq_len')}={c.seq_len} exceeds the position table (model.max_positions="
          f"{m.max_positions}); lower --config.{key('seq_len', 'seq_len')} or raise --config.model.max_positions")
    check(c.seq_len >= 8, f"{key('seq_len', 'seq_len')}={c.seq_len} is too short for a [CLS] A [SEP] B [SEP] "
          "pair; use >= 8")
    budget = max_predictions(c)
    check(1 <= budget <= c.seq_len, f"{key('max_predictions', 'masking.max_predictions')}={budget} must be between "
          f"1 and seq_len={c.seq_len}; fix --config.{key('max_predictions', 'masking.max_predictions')}")
    check(c.batch_size > 0 and c.batch_size % c.grad_accum_steps == 0,
          f"{key('batch_size', 'batch_size')}={c.batch_size} is not a positive multiple of grad_accum_steps="
          f"{c.grad_accum_steps}; fix --config.{key('batch_size', 'batch_size')}")


# Keys added after runs had been saved without them whose default is not what such a run ran under: the value it
# did run under (the code's behaviour before the key existed), from the saved section. A key missing from this
# table reads with its default, which then is the old behaviour.
def load(spec: str) -> ml_collections.ConfigDict:
  """A config from "path/to/file.py:arg", as --config=... names it (for tests and notebooks)."""
  import importlib.util

  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location(f"bertjax_config_{abs(hash(path))}", path)
  if module_spec is None:
    raise UserError(f"no config file at {path!r}")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def tiny_on_demo(c: ml_collections.ConfigDict, vocab_size: int = 2000) -> ml_collections.ConfigDict:
  """The CPU smoke-test recipe every config's `tiny` variant shares: the demo corpus (~100k tokens)
  with its own small SentencePiece vocabulary, float32, under five minutes on two cores. A small vocabulary
  and a high learning rate (2e-3, 60 warmup steps, linear decay over 600 steps) suit a corpus this size."""
  c.model.vocab_size = vocab_size
  c.model.dtype = "float32"
  c.batch_size, c.seq_len = 32, 128
  c.total_steps, c.learning_rate = 600, 2e-3
  c.warmup_steps, c.warmup_fraction = -1, 0.1  # 60 steps of 600; a shorter run keeps the shape
  # Adam's bias correction on, whatever the family's published rule: at 2e-3 without it the first updates are
  # about 3x larger (sqrt(1 - b2) against 1 - b1) and a 600-step tiny BERT stalls (eval MLM accuracy 0.041 at
  # step 300, against 0.088 with it). The published sizes keep their reference's rule (docs/recipes.md).
  c.optimizer.bias_correction = True
  c.log_every, c.eval_every, c.checkpoint_every = 50, 200, 200
  return c
