"""The run config's common skeleton, its validation, and the values derived from it (never stored twice).

configs/*.py start from `defaults()` and set their paper's recipe; every key is overridable from the
command line (`--config.model.hidden_size=256`). Objective weights of 0 switch an objective off, so any
combination is a command-line change: `--config.objectives.sop=1 --config.objectives.nsp=0`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax import masking, optim
from bertjax.data import instances
from bertjax.errors import UserError
from bertjax.model import attention as attention_lib
from bertjax.model.encoder import REMAT_POLICIES, SHARING_MODES, EncoderConfig

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
  c.sharding = "dp"  # dp | fsdp | fsdp_tp (bertjax.sharding.PRESETS)
  c.mesh = dict(data=0, fsdp=0, tensor=0)  # mesh axis sizes; 0 keeps the preset's
  c.sharding_rules = ""  # explicit rules replacing the preset's: "embed=fsdp,mlp=tensor,activation_batch=data+fsdp"
  c.init_from = ""  # a checkpoint to take weights from (a new run), not a resume
  c.overwrite = False  # allow a workdir holding another config's run to be replaced
  # Data.
  c.data = dict(
      source="demo",  # demo | text:GLOB | tfds:NAME[:SPLIT] | shards:DIR (written by python -m bertjax.prepare)
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
      prepare_workers=0,  # processes preparing a source into the cache (0: in this one; big corpora: bertjax.prepare)
      # Shard files are checked against metadata.json before training reads them: size (always), and sha256:
      # first (once per file state, recorded in the cache) | full (every start) | size (never).
      verify="first",
  )
  # Masking.
  c.masking = dict(
      scheme="token",  # token | whole_word | ngram | span
      mask_prob=0.15,
      max_predictions=0,  # MLM slots per example (the budget); 0: ceil(seq_len x mask_prob)
      mask_token_prob=0.8,  # of the chosen tokens: share replaced by [MASK]
      random_token_prob=0.1,  # ... by a random token (the rest stay as they are)
      max_ngram=3,  # ngram scheme
      span_p=0.2,  # span scheme: geometric parameter
      max_span=10,  # span scheme: longest span in words
      wso_share=0.05,  # objective wso: share of the unmasked trigrams shuffled (StructBERT: 5%)
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
      layer_norm_eps=1e-12,
      init_std=0.02,
      sharing="none",  # none | all | attention | ffn (ALBERT cross-layer sharing)
      num_hidden_groups=1,  # ALBERT: distinct parameter sets of the shared blocks
      generator_fraction=0.0,  # ELECTRA: generator width as a fraction of the discriminator's
      sample_temperature=1.0,  # ELECTRA: generator sampling temperature
      dtype="float32",  # compute dtype: float32 | bfloat16 (params stay float32)
      remat="none",  # none | full | dots | dots_no_batch
      scan_unroll=0,  # layers per scan iteration (0: automatic); aot's cost estimate unrolls shallow copies
      activation="gelu",  # gelu (exact) | gelu_new (tanh approximation; some HF checkpoints)
      position_offset=0,  # first position id (RoBERTa checkpoints: 2)
      # auto | xla | dot_product | cudnn | splash (bertjax.model.attention). auto: cuDNN flash attention on
      # GPU, splash on TPU, xla on CPU; fused kernels need attention_dropout=0, else auto keeps xla.
      attention="auto",
      head_size=0,  # width of one attention head; 0: hidden_size / num_heads (a head-pruned model sets it)
  )
  # Objectives: name -> weight; 0 switches one off.
  c.objectives = dict(mlm=1.0, nsp=0.0, sop=0.0, rtd=0.0, sbo=0.0, wso=0.0, sso=0.0)
  # Optimizer.
  c.optimizer = dict(
      name="adamw",  # adamw | lamb
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,  # not applied to biases and LayerNorm
      clip_norm=1.0,  # global gradient norm
      schedule="linear",  # linear (BERT/ALBERT) | linear_after_warmup (RoBERTa) | electra | cosine | poly_sqrt: bertjax.optim
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
      # exit 75 (restartable), naming the step and the peer that did not come (bertjax.runtime: XLA:CPU's own
      # collective timeout). A restarted run scales it down to 50x the step time it measured, 300 s at least.
      step_timeout_s=1200.0,
  )
  return c


def active_objectives(config) -> dict:
  """The objectives with a nonzero weight, in a fixed order."""
  return {k: float(v) for k, v in sorted(config.objectives.items()) if v}


def encoder_config(m, generator: bool = False, platform: str | None = None) -> EncoderConfig:
  """The frozen EncoderConfig of the main network, or of the ELECTRA generator (widths scaled), with the
  attention implementation that model.attention resolves to on `platform` (default: JAX's backend)."""
  f = m.generator_fraction if generator else 1.0
  impl, _ = attention_lib.resolve(m.attention, m.attention_dropout, platform or jax.default_backend(), m.dtype,
                                  strict=False)
  hidden = int(m.hidden_size * f)
  return EncoderConfig(
      vocab_size=m.vocab_size, hidden_size=hidden, num_layers=m.num_layers,
      num_heads=max(1, int(m.num_heads * f)), intermediate_size=int(m.intermediate_size * f),
      embedding_size=m.embedding_size or m.hidden_size, max_positions=m.max_positions,
      type_vocab_size=m.type_vocab_size, dropout=m.dropout, attention_dropout=m.attention_dropout,
      layer_norm_eps=m.layer_norm_eps, init_std=m.init_std, sharing=m.sharing,
      num_groups=m.num_hidden_groups if m.sharing != "none" else 1, dtype=DTYPES[m.dtype], remat=m.remat,
      scan_unroll=m.scan_unroll,
      activation=m.activation, position_offset=m.position_offset, attention=impl, head_size=m.head_size)


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


def lr_schedule(config) -> optax.Schedule:
  """The run's learning rate at each step: optimizer.schedule from 0 to learning_rate over the warmup, down to
  0 at total_steps; a phase with its own learning_rate runs that schedule over its own steps instead."""
  kind = config.optimizer.schedule
  run = optim.schedule(kind, config.learning_rate, warmup_steps(config), config.total_steps)
  plan = phases(config)
  if all(not p.learning_rate for p in plan):
    return run
  pieces = [optim.schedule(kind, p.learning_rate, p.warmup_steps, p.steps)
            if p.learning_rate else (lambda t, s=p.start: run(t + s)) for p in plan]
  return optax.join_schedules(pieces, [p.start for p in plan[1:]])


def max_predictions(config) -> int:
  """The MLM slots gathered per example (static shape): masking.max_predictions, or ceil(seq_len x mask_prob)."""
  return config.masking.max_predictions or masking.max_predictions(config.seq_len, config.masking.mask_prob)


def masking_config(config, special) -> masking.MaskingConfig:
  """The config's masking scheme with the tokenizer's special ids (`special`: a data.tokenizer.SpecialIds)."""
  k = config.masking
  return masking.MaskingConfig(
      special_ids=special.never_masked, mask_id=special.mask, vocab_size=config.model.vocab_size,
      scheme=k.scheme, mask_prob=k.mask_prob, max_predictions=max_predictions(config),
      mask_token_prob=k.mask_token_prob, random_token_prob=k.random_token_prob, max_ngram=k.max_ngram,
      span_p=k.span_p, max_span=k.max_span, **_shuffling(config))


def _shuffling(config) -> dict:
  """StructBERT's trigram shuffling, on while the wso objective is."""
  if "wso" not in active_objectives(config):
    return dict(shuffle_share=0.0, max_shuffled=0)
  return dict(shuffle_share=config.masking.wso_share,
              max_shuffled=masking.shuffle_slots(config.seq_len, config.masking.wso_share))


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def validate(config):
  """Checks that the config is self-consistent; raises UserError with the fix on the first problem."""
  m = config.model
  _check(m.head_size > 0 or m.hidden_size % m.num_heads == 0,
         f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; "
         "change one of them so that the head width is whole")
  _check(m.activation in ("gelu", "gelu_new"), f"model.activation={m.activation!r}; use gelu or gelu_new")
  _check(m.sharing in SHARING_MODES, f"model.sharing={m.sharing!r}; use one of {', '.join(SHARING_MODES)}")
  _check(m.remat in REMAT_POLICIES, f"model.remat={m.remat!r}; use one of {', '.join(REMAT_POLICIES)}")
  _check(m.dtype in DTYPES, f"model.dtype={m.dtype!r}; use one of {', '.join(DTYPES)}")
  _check(m.num_hidden_groups >= 1 and m.num_layers % m.num_hidden_groups == 0,
         f"model.num_hidden_groups={m.num_hidden_groups} must divide model.num_layers={m.num_layers}")
  _check(config.masking.scheme in masking.SCHEMES,
         f"masking.scheme={config.masking.scheme!r}; use one of {', '.join(masking.SCHEMES)}")
  _check(0 < config.masking.mask_prob < 1, f"masking.mask_prob={config.masking.mask_prob} must be in (0, 1)")
  _check(config.masking.mask_token_prob + config.masking.random_token_prob <= 1,
         "masking.mask_token_prob + masking.random_token_prob must not exceed 1")
  from bertjax import objectives as objectives_lib

  unknown = set(config.objectives) - set(objectives_lib.REGISTRY)
  _check(not unknown, f"unknown objectives {sorted(unknown)}; use {', '.join(objectives_lib.REGISTRY)}")
  objectives = active_objectives(config)
  others = sorted(o for o in objectives if o != "mlm" and not o.startswith("distill_"))
  _check(not config.get("teacher") or not others,
         f"distillation trains an MLM student: set the {', '.join(others)} weight{'s' if len(others) > 1 else ''} to 0")
  _check(bool(objectives), "no objective has a nonzero weight; set e.g. --config.objectives.mlm=1")
  _check("mlm" in objectives, "every setup here trains an MLM head (ELECTRA's generator included); set --config.objectives.mlm")
  _check(("rtd" in objectives) == (m.generator_fraction > 0),
         "the rtd objective needs a generator and a generator needs rtd: set both "
         "--config.objectives.rtd and --config.model.generator_fraction, or neither")
  _check(m.type_vocab_size >= 2 or not ({"nsp", "sop", "sso"} & set(objectives)),
         "NSP/SOP/SSO pairs need model.type_vocab_size >= 2")
  for name in ("sbo", "wso"):
    _check(name not in objectives or "rtd" not in objectives,
           f"the {name} objective decodes through the MLM head on the main encoder, which ELECTRA's discriminator "
           f"lacks; switch off --config.objectives.{name} or --config.objectives.rtd")
  _check("wso" not in objectives or 0 < config.masking.wso_share < 1,
         f"masking.wso_share={config.masking.wso_share} must be in (0, 1) for the wso objective")
  _check(config.optimizer.name in ("adamw", "lamb"), f"optimizer.name={config.optimizer.name!r}; use adamw or lamb")
  _check(config.optimizer.schedule in optim.SCHEDULES,
         f"optimizer.schedule={config.optimizer.schedule!r}; use one of {', '.join(optim.SCHEDULES)}")
  _check(config.warmup_steps <= config.total_steps,
         f"warmup_steps={config.warmup_steps} exceeds total_steps={config.total_steps}; lower --config.warmup_steps, "
         "or give warmup as a share of the run: --config.warmup_steps=-1 --config.warmup_fraction=0.1")
  _check(config.warmup_steps >= -1, f"warmup_steps={config.warmup_steps}; use >= 0, or -1 for warmup_fraction")
  _check(0 <= config.warmup_fraction < 1, f"warmup_fraction={config.warmup_fraction} must be in [0, 1)")
  _check(config.masking.max_predictions >= 0,
         f"masking.max_predictions={config.masking.max_predictions}; use >= 1, or 0 for ceil(seq_len x mask_prob)")
  _validate_phases(config)
  attention_lib.check(m.attention, m.attention_dropout, m.dtype, [p.config.seq_len for p in phases(config)])
  _check(0 < config.data.eval_fraction < 1, f"data.eval_fraction={config.data.eval_fraction} must be in (0, 1)")
  _check(config.data.format in ("auto",) + instances.FORMATS,
         f"data.format={config.data.format!r}; use auto, electra, single, full_sentences or packed "
         "(nsp and sop follow the objectives)")
  _check(m.type_vocab_size >= 2 or config.data.format != "electra",
         "data.format=electra makes segment-B tokens (type id 1); set --config.model.type_vocab_size=2")
  _check(config.data.tokenizer_model in ("unigram", "bpe"),
         f"data.tokenizer_model={config.data.tokenizer_model!r}; use unigram or bpe")
  for key in ("log_every", "eval_every", "checkpoint_every", "total_steps", "batch_size", "max_nonfinite_steps"):
    _check(config[key] > 0, f"{key}={config[key]} must be positive")


def _validate_phases(config):
  """config.phases' entries, and the shapes (seq_len, batch, masking budget) of every phase."""
  for i, p in enumerate(config.phases):
    _check(isinstance(p, dict) and set(p) == set(phase(1.0)),
           f"phases[{i}] is {p!r}; make each phase with bertjax.config.phase(fraction, ...)")
    _check(p["fraction"] > 0 and p["learning_rate"] >= 0 and 0 <= p["warmup_fraction"] < 1,
           f"phases[{i}]: fraction must be > 0, learning_rate >= 0 and warmup_fraction in [0, 1); got {p!r}")
  if config.phases:
    total = sum(p["fraction"] for p in config.phases)
    _check(abs(total - 1) < 1e-6, f"the phases' fractions add up to {total:g}, not 1; fix --config.phases[i].fraction")
  for ph in phases(config):
    key = (lambda k, run_key: run_key) if not config.phases else (lambda k, run_key: f"phases[{ph.index}].{k}")
    c, m = ph.config, ph.config.model
    _check(ph.steps >= 1, f"phase {ph.index + 1} has no steps at total_steps={config.total_steps}; raise "
           f"--config.total_steps or --config.{key('fraction', '')}")
    _check(c.seq_len + m.position_offset <= m.max_positions,
           f"{key('seq_len', 'seq_len')}={c.seq_len} exceeds the position table (model.max_positions="
           f"{m.max_positions}); lower --config.{key('seq_len', 'seq_len')} or raise --config.model.max_positions")
    _check(c.seq_len >= 8, f"{key('seq_len', 'seq_len')}={c.seq_len} is too short for a [CLS] A [SEP] B [SEP] "
           "pair; use >= 8")
    budget = max_predictions(c)
    _check(1 <= budget <= c.seq_len, f"{key('max_predictions', 'masking.max_predictions')}={budget} must be between "
           f"1 and seq_len={c.seq_len}; fix --config.{key('max_predictions', 'masking.max_predictions')}")
    _check(c.batch_size > 0 and c.batch_size % c.grad_accum_steps == 0,
           f"{key('batch_size', 'batch_size')}={c.batch_size} is not a positive multiple of grad_accum_steps="
           f"{c.grad_accum_steps}; fix --config.{key('batch_size', 'batch_size')}")


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """A saved config (a workdir's config.json) over today's defaults, so that a run saved before a key
  existed reads with that key's default."""

  def merge(base: ml_collections.ConfigDict, values: dict):
    for key, value in values.items():
      if isinstance(value, dict) and isinstance(base.get(key), ml_collections.ConfigDict):
        merge(base[key], value)
      else:
        base[key] = value
    return base

  return merge(defaults(), saved)


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
  c.log_every, c.eval_every, c.checkpoint_every = 50, 200, 200
  return c
