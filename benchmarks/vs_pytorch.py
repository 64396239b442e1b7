"""bertjax's train step against HF transformers' BERT pretraining model in PyTorch, side by side.

Same BERT config, batch, sequence length and precision; both train MLM on 15% of the tokens plus NSP with
AdamW and gradient clipping at 1.0. bertjax runs its real jitted train step (masking on device included);
PyTorch runs HF's `BertModel` + `BertPreTrainingHeads` with the masked batch made once beforehand, as a data
loader would. PyTorch runs in a process of its own (its own glibc malloc policy on CPU:
`bertjax/core/runtime.py`'s `BERTJAX_HOST_MALLOC=retain` for bertjax's process, `--torch_malloc=retain` for
PyTorch's; on GPU, its own CUDA context). Steps of the two alternate in rounds, so both see the same machine
load; the medians and their ratio are printed, then one JSON line.

**Equal work.** bertjax decodes only the `max_predictions` masked slots through the vocabulary; HF's
`BertForPreTraining.forward` decodes every position (1.22x the FLOPs at base, 1.46x at tiny). By default
(`--torch_head=masked`) the PyTorch side gathers the masked positions and applies the same prediction head
(HF's own `cls.predictions`) to them only, so both do the same FLOPs per token and the ratio of tokens/s is
the ratio of speed. `--torch_head=all` runs stock `BertForPreTraining` instead; then the FLOP-normalized ratio
(both counted by `bertjax.model.flops`, HF's with the head on every position) is the comparable one.

CPU (default): float32, dropout 0.1 on both sides, PyTorch's default attention; MFU against a 2048^3 float32
matmul timed between rounds in this process, as `python -m bertjax.train.bench` does. **Routing settings**
(issue #35, docs/cpu.md): on CPU bertjax runs once per `--settings` entry, each in a process of its own (XLA
reads its flags once per process; benchmarks/cpu_routing.py's SETTINGS), all alternating with PyTorch in the
same rounds; the printout gives each setting's equal-work ratio to PyTorch with the spread of its per-round
ratios, bertjax's `default` beside `xla` (XLA's own routing, the routing before issue #35), and each setting's
first-step numerics and dot census (which library runs its matmuls).
GPU (`--device=gpu`): bfloat16 compute; bertjax with its fastest attention (`model.attention=auto`: cuDNN
flash attention, which needs attention dropout 0, so both sides train with attention dropout 0 and hidden
dropout 0.1); PyTorch with bf16 autocast, SDPA attention and fused AdamW, eager and (a second row)
`torch.compile`d. MFU against the GPU's dense bf16 peak (`bertjax.model.flops.PEAK_FLOPS`), peak memory of each.
**Thread scaling** (`--scaling`, CPU, issue #49): each side runs twice, one process pinned to one core (bertjax:
XLA sizes its thread pool and its loop partitions from the process's CPU affinity; PyTorch: that core and
`torch.set_num_threads(1)`) and one on every core, all four alternating in the same rounds; the printout adds each
framework's all-core step time over its one-core step time (0.5: a second core halves the step; 1.0: it gains
nothing), with the spread of the per-round quotients, and whether bertjax gains at least as much as PyTorch.

  python benchmarks/vs_pytorch.py                        # CPU: tiny (batch 32) and base (batch 8), seq 128
  python benchmarks/vs_pytorch.py --variants=base --batch_size=8 --steps=5 --rounds=3
  python benchmarks/vs_pytorch.py --variants=base --settings=default,xla --steps=3 --rounds=6   # two processes
  BERTJAX_HOST_MALLOC=retain python benchmarks/vs_pytorch.py --torch_malloc=retain   # README's CPU figures
  python benchmarks/vs_pytorch.py --variants=base --scaling --steps=2 --rounds=3   # 1 core vs all, both sides
  python benchmarks/vs_pytorch.py --device=gpu           # one GPU: BERT-large 32 x 512, BERT-base 128 x 128
"""

import contextlib
import functools
import json
import multiprocessing
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np
from absl import flags

from bertjax.core import config as config_lib, runtime
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import config as model_config, flops
from bertjax.objectives import masking
from bertjax.train import bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_routing  # noqa: E402 (the CPU routing settings)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Default (batch, seq_len) per device and variant. CPU: tiny's own recipe; base at the batch `python -m
# bertjax.train.bench` is quoted at. GPU: the shapes the targets name (BERT-large at 512, base at 128), with
# batches that keep one H100 busy.
SHAPES = {"cpu": {"tiny": (32, 128), "base": (8, 128), "large": (4, 128)},
          "gpu": {"large": (32, 512), "base": (128, 128), "tiny": (256, 128)}}
DEFAULT_VARIANTS = {"cpu": ["tiny", "base"], "gpu": ["large", "base"]}
# bertjax's CPU routing settings timed by default (cpu_routing.SETTINGS; each a process holding a model):
# bertjax's default, XLA's own routing with a rolled layer scan (the step before issue #35), and the default with
# issue #49's dropout lever taken back (Threefry masks). The other settings (issue #35's routing levers, each
# measured slower: docs/cpu.md) run with --settings=NAME,... or --settings=all.
DEFAULT_SETTINGS = ["default", "xla", "threefry_masks"]



def bert_config(variant: str, batch_size: int, seq_len: int, device: str = "cpu"):
  """The variant's bertjax config at the benchmark's batch and sequence length: float32 on CPU; bf16 on GPU
  with attention dropout 0 (what lets `model.attention=auto` pick cuDNN flash attention)."""
  config = config_lib.load(os.path.join(REPO, f"configs/bert.py:{variant}"))
  default_batch, default_seq = SHAPES[device].get(variant, (8, 128))
  config.batch_size, config.seq_len = batch_size or default_batch, seq_len or default_seq
  config.phases = ()  # one shape: the one given
  config.model.dtype = "bfloat16" if device == "gpu" else "float32"
  if device == "gpu":
    config.model.attention_dropout = 0.0
    config.model.attention = "auto"
  return config


def torch_spec(config, device: str = "cpu", head: str = "masked") -> dict:
  """What the PyTorch process needs of the config: HF BertConfig arguments (same sizes, dropout and
  LayerNorm epsilon), AdamW's and the clipping norm, where it runs and which MLM head it trains."""
  m, o = config.model, config.optimizer
  return dict(
      bert=dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size, hidden_act="gelu",
                hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.attention_dropout,
                max_position_embeddings=m.max_positions, type_vocab_size=m.type_vocab_size,
                layer_norm_eps=m.layer_norm_eps, initializer_range=m.init_std),
      adamw=dict(lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps, weight_decay=o.weight_decay),
      clip_norm=o.clip_norm, device=device, head=head)


def torch_model(spec: dict):
  """HF BertForPreTraining from `torch_spec`, in train mode, on its device (on GPU with SDPA attention),
  and its AdamW (fused on GPU)."""
  import torch
  from transformers import BertConfig, BertForPreTraining

  gpu = spec["device"] == "gpu"
  kwargs = dict(attn_implementation="sdpa") if gpu else {}
  model = BertForPreTraining(BertConfig(**spec["bert"], **kwargs)).train().to("cuda" if gpu else "cpu")
  opt = torch.optim.AdamW(model.parameters(), **spec["adamw"], **(dict(fused=True) if gpu else {}))
  return model, opt


def torch_batch(config, batch: dict, seed: int = 0) -> dict:
  """The synthetic batch masked as BERT does (15% of non-special tokens, at most max_predictions per
  row; 80% [MASK], 10% random, 10% kept), as int64 arrays (torch's inputs): `labels` with -100 on unscored
  positions (stock HF head), and the same targets as bertjax gathers them, `mlm_positions` / `mlm_labels`
  [batch, max_predictions] with -100 on unused slots (masked-only head)."""
  sp = SPM_SPECIAL
  rng = np.random.default_rng(seed)
  ids = batch["input_ids"].copy()
  labels = np.full_like(ids, -100)
  p = masking.make_config(config, sp)
  positions = np.zeros((ids.shape[0], p.max_predictions), np.int64)
  slot_labels = np.full((ids.shape[0], p.max_predictions), -100, np.int64)
  for row in range(ids.shape[0]):
    candidates = np.nonzero(~np.isin(ids[row], [sp.pad, sp.unk, sp.cls, sp.sep, sp.mask]))[0]
    n = min(p.max_predictions, max(1, round(len(candidates) * p.mask_prob)))
    chosen = np.sort(rng.choice(candidates, n, replace=False))
    labels[row, chosen] = ids[row, chosen]
    positions[row, :n], slot_labels[row, :n] = chosen, ids[row, chosen]
    u = rng.random(n)
    ids[row, chosen[u < 0.8]] = sp.mask
    rand = chosen[(u >= 0.8) & (u < 0.9)]
    ids[row, rand] = rng.integers(5, config.model.vocab_size, len(rand))
  t = lambda a: np.asarray(a, np.int64)
  return dict(input_ids=t(ids), token_type_ids=t(batch["type_ids"]), attention_mask=t(batch["groups"] > 0),
              labels=t(labels), next_sentence_label=t(batch["sentence_label"]), mlm_positions=positions,
              mlm_labels=slot_labels)


def torch_loss(model, batch: dict, head: str):
  """MLM + NSP loss. `all`: stock BertForPreTraining (vocabulary logits at every position). `masked`: HF's
  encoder and heads, the prediction head applied to the gathered masked positions only (bertjax's work)."""
  import torch.nn.functional as F

  inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
  if head == "all":
    return model(**inputs, labels=batch["labels"], next_sentence_label=batch["next_sentence_label"]).loss
  sequence, pooled = model.bert(**inputs)[:2]
  index = batch["mlm_positions"][..., None].expand(-1, -1, sequence.shape[-1])
  logits = model.cls.predictions(sequence.gather(1, index))  # [batch, max_predictions, vocab]
  mlm = F.cross_entropy(logits.flatten(0, 1).float(), batch["mlm_labels"].flatten(), ignore_index=-100)
  return mlm + F.cross_entropy(model.cls.seq_relationship(pooled).float(), batch["next_sentence_label"])


def torch_step(loss_fn, model, opt, batch, spec: dict):
  """One training step; `loss_fn(model, batch)` is `torch_loss` with the spec's head, or its torch.compile."""
  import torch

  with torch.autocast("cuda", dtype=torch.bfloat16, enabled=spec["device"] == "gpu"):
    loss = loss_fn(model, batch)
  loss.backward()
  torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip_norm"])
  opt.step()
  opt.zero_grad(set_to_none=True)


def time_torch(loss_fn, model, opt, batch, spec: dict, steps: int) -> list:
  import torch

  sync = torch.cuda.synchronize if spec["device"] == "gpu" else (lambda: None)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    torch_step(loss_fn, model, opt, batch, spec)
    sync()
    times.append(time.perf_counter() - t0)
  return times


def torch_matmul_peak(n: int = 2048, repeats: int = 10) -> float:
  """FLOP/s of an n^3 float32 matmul in PyTorch (MKL), the median of `repeats` runs (for context)."""
  import torch

  a, b = torch.randn(n, n), torch.randn(n, n)
  a @ b
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t0)
  return 2.0 * n**3 / statistics.median(times)


def torch_process(conn, spec: dict, batch: dict, threads: int, compile_model: bool):
  """The PyTorch side, in its own process: builds the model, then answers ("steps", n) with n step times,
  ("matmul",) with `torch_matmul_peak()` and ("memory",) with the peak GPU memory (bytes), until ("close",)."""
  runtime.setup()  # BERTJAX_HOST_MALLOC as TorchProcess set it, before torch starts its threads
  import torch

  torch.set_num_threads(threads)
  model, opt = torch_model(spec)
  loss_fn = functools.partial(torch_loss, head=spec["head"])
  if compile_model:
    loss_fn = torch.compile(loss_fn)
  device = "cuda" if spec["device"] == "gpu" else "cpu"
  batch = {k: torch.as_tensor(v).to(device) for k, v in batch.items()}
  conn.send(dict(threads=torch.get_num_threads(), version=torch.__version__,
                 device=torch.cuda.get_device_name() if device == "cuda" else "cpu"))
  while (msg := conn.recv())[0] != "close":
    if msg[0] == "steps":
      conn.send(time_torch(loss_fn, model, opt, batch, spec, msg[1]))
    elif msg[0] == "memory":
      conn.send(torch.cuda.max_memory_allocated() if device == "cuda" else 0)
    else:
      conn.send(torch_matmul_peak())


class TorchProcess:
  """`torch_process` in a child process started with the requested glibc malloc policy (a spawned child
  inherits `BERTJAX_HOST_MALLOC`, which `runtime.setup()` applies first thing in `torch_process`)."""

  def __init__(self, spec: dict, batch: dict, threads: int, malloc: str, compile_model: bool = False):
    self.spec = spec
    ctx = multiprocessing.get_context("spawn")
    self.conn, child = ctx.Pipe()
    saved = os.environ.get("BERTJAX_HOST_MALLOC")
    os.environ["BERTJAX_HOST_MALLOC"] = malloc
    try:
      self.proc = ctx.Process(target=torch_process, args=(child, spec, batch, threads, compile_model),
                              daemon=True)
      self.proc.start()
    finally:
      if saved is None:
        del os.environ["BERTJAX_HOST_MALLOC"]
      else:
        os.environ["BERTJAX_HOST_MALLOC"] = saved
    self.info = self.conn.recv()

  def steps(self, n: int) -> list:
    self.conn.send(("steps", n))
    return self.conn.recv()

  def matmul_peak(self) -> float:
    self.conn.send(("matmul",))
    return self.conn.recv()

  def peak_memory(self) -> int:
    self.conn.send(("memory",))
    return self.conn.recv()

  def close(self):
    self.conn.send(("close",))
    self.proc.join()


def hf_flops_per_token(config) -> float:
  """Training FLOPs per token of HF's model: bertjax's count with the MLM head on every position."""
  from bertjax.model import flops

  cfg = model_config.encoder_config(config.model)
  return flops.train_flops_per_token(cfg, config.seq_len, config.seq_len, sentence_head=True)


class InProcessSide:
  """bertjax's train step in this process (the GPU: one process owns the device): the `bench.StepProcess`
  interface (`info`, `steps(n)`, `close()`)."""

  def __init__(self, config):
    from bertjax.train import census

    job = bench.pretrain_job(config)
    self.job, self.state = job, job.run(job.state)
    self.info = dict(compile_seconds=job.compile_seconds, census=census.census(job.hlo),
                     first_step=job.scalars(self.state), tokens=job.tokens, xla_flags=os.environ.get("XLA_FLAGS", ""),
                     peak_memory_bytes=job.peak_memory)

  def steps(self, n: int) -> list:
    times = []
    for _ in range(n):
      t0 = time.perf_counter()
      self.state = self.job.run(self.state)
      times.append(time.perf_counter() - t0)
    return times

  def close(self):
    del self.state


def step_job(variant: str, batch_size: int, seq_len: int, device: str, overrides: dict) -> bench.Job:
  """What a bertjax StepProcess builds: the variant's train step at the benchmark's shape (`bert_config`)."""
  return bench.pretrain_job(cpu_routing.with_overrides(bert_config(variant, batch_size, seq_len, device), overrides))


@contextlib.contextmanager
def pinned(cores):
  """Processes started inside run on `cores` only: a spawned child inherits the CPU affinity of the thread that
  starts it, and XLA (its thread pool, hence its loop partitions) and PyTorch size themselves from it. None:
  affinity unchanged. Only this (the calling) thread's affinity changes, and only for the block."""
  if cores is None:
    yield
    return
  saved = os.sched_getaffinity(0)
  os.sched_setaffinity(0, cores)
  try:
    yield
  finally:
    os.sched_setaffinity(0, saved)


def scaling_sides(config, variant: str, head: str, malloc: str) -> tuple:
  """`--scaling`: (PyTorch sides, bertjax sides), each framework's step twice, in a process pinned to one core
  (PyTorch with one thread) and in one on every core of this process's affinity; named `<side>@<cores>`."""
  every = os.sched_getaffinity(0)
  torch, jax_ = {}, {}
  for cores in ({min(every)}, every):
    with pinned(cores):
      torch.update({f"{name}@{len(cores)}": side for name, side in
                    torch_sides(config, "cpu", head, len(cores), malloc, False).items()})
      jax_.update({f"{name}@{len(cores)}": side for name, side in
                   jax_sides(config, variant, "cpu", ["default"]).items()})
  return torch, jax_


def cores_of(name: str) -> int:
  """The cores a `scaling_sides` side runs on (0: not a scaling side)."""
  return int(name.partition("@")[2] or 0)


def thread_scaling(r: dict) -> dict:
  """Per framework of a `compare` result over `scaling_sides`: its all-core step time over its one-core step time
  (medians of all steps; 0.5 = a second core halves the step), the [min, max] of the per-round quotients, and the
  cores of each."""
  out = {}
  for framework in ("bertjax", "torch"):
    by_cores = sorted(r[framework].items(), key=lambda kv: cores_of(kv[0]))
    (_, one), (_, every) = by_cores[0], by_cores[-1]
    per_round = [a / b for a, b in zip(every["round_seconds"], one["round_seconds"])]
    out[framework] = dict(scaling=every["step_seconds"] / one["step_seconds"], min=min(per_round),
                          max=max(per_round), cores=(cores_of(by_cores[0][0]), cores_of(by_cores[-1][0])))
  return out


def jax_sides(config, variant: str, device: str, names: list) -> dict:
  """bertjax's sides: on CPU one process per routing setting (`cpu_routing.settings()`: XLA flags and model
  switches; XLA reads its flags once per process), on GPU the step in this process."""
  if device == "gpu":
    return {"default": InProcessSide(config)}
  table = cpu_routing.settings()
  sides = {}
  for name in names:
    flags, overrides = table[name]
    env = {"XLA_FLAGS": flags, runtime.CPU_FLAGS_ENV: "off"}
    sides[name] = bench.StepProcess(step_job, (variant, config.batch_size, config.seq_len, device, overrides), env)
  return sides


def compare(config, steps: int, rounds: int, sides: dict, device: str, jax_side: dict) -> dict:
  """Side-by-side medians of one `bert_config`'s train step in bertjax (each side of `jax_side`: name ->
  StepProcess or InProcessSide, one per routing setting) and in each PyTorch process of `sides` (name ->
  TorchProcess, each holding its model), all alternating in rounds. MFU: on CPU against a 2048^3 float32 XLA
  matmul timed in this process between rounds (same machine load), on GPU against the device's dense bf16 peak.
  Each side's FLOPs per token are counted the same way (`bertjax.model.flops`): equal for the masked-only head."""
  from bertjax.model import flops as flops_lib

  b = bench.setup(config)  # shapes and FLOPs only; nothing is compiled here
  for side in (*sides.values(), *jax_side.values()):
    side.steps(2)  # warm-up
  jax_times = {name: [] for name in jax_side}
  jax_rounds = {name: [] for name in jax_side}
  torch_times, torch_rounds = {name: [] for name in sides}, {name: [] for name in sides}
  probe = bench.MatmulProbe() if device == "cpu" else None
  for r in range(rounds):
    order = [*jax_side.items(), *sides.items()]
    for name, side in order if r % 2 == 0 else order[::-1]:  # alternate who goes first
      time.sleep(0.5)  # let the other runtime's worker threads go idle
      t = side.steps(steps)
      (jax_times if name in jax_side else torch_times)[name] += t
      (jax_rounds if name in jax_side else torch_rounds)[name].append(statistics.median(t))
    if probe:
      time.sleep(0.5)
      probe.sample()
  tokens = b.batch_size * b.seq_len
  peak = probe.flops_per_sec() if probe else flops_lib.peak_flops(jax.devices()[0])
  r = dict(batch_size=b.batch_size, seq_len=b.seq_len, dtype=config.model.dtype,
           attention=b.steps.model.cfg.attention, peak_flops_per_sec=peak, bertjax_flops_per_token=b.flops_per_token,
           bertjax={}, torch={})
  for name, side in jax_side.items():
    tps = tokens / statistics.median(jax_times[name])
    r["bertjax"][name] = dict(tokens_per_sec=tps, step_seconds=statistics.median(jax_times[name]),
                              round_seconds=jax_rounds[name],
                              compile_seconds=side.info["compile_seconds"], first_step=side.info["first_step"],
                              mfu=tps * b.flops_per_token / peak if peak else None,
                              census=side.info["census"]["libraries"], xla_flags=side.info["xla_flags"],
                              peak_memory_bytes=side.info["peak_memory_bytes"])
  for name, side in sides.items():
    head = side.spec["head"]
    torch_fpt = b.flops_per_token if head == "masked" else hf_flops_per_token(config)
    tps = tokens / statistics.median(torch_times[name])
    r["torch"][name] = dict(
        head=head, threads=side.info["threads"], tokens_per_sec=tps,
        step_seconds=statistics.median(torch_times[name]), round_seconds=torch_rounds[name], flops_per_token=torch_fpt,
        mfu=tps * torch_fpt / peak if peak else None, peak_memory_bytes=side.peak_memory(), ratios={})
    for jname, j in r["bertjax"].items():
      if cores_of(jname) != cores_of(name):  # --scaling: compare sides on the same cores only
        continue
      per_round = [torch_rounds[name][i] / jax_rounds[jname][i] for i in range(rounds)]
      r["torch"][name]["ratios"][jname] = dict(
          ratio=j["tokens_per_sec"] / tps, min=min(per_round), max=max(per_round),
          flop_normalized=j["tokens_per_sec"] * b.flops_per_token / (tps * torch_fpt))
  return r


def torch_sides(config, device: str, head: str, threads: int, malloc: str, compiled: bool) -> dict:
  """PyTorch processes holding the config's model and the masked synthetic batch bertjax also trains on
  (`bench.setup` draws the same one): `eager`, and on GPU with `compiled` a torch.compile'd one too."""
  batch = torch_batch(config, bench.synthetic_batch(config, config.batch_size))
  spec = torch_spec(config, device, head)
  names = ["eager"] + (["compiled"] if device == "gpu" and compiled else [])
  return {name: TorchProcess(spec, batch, threads or os.cpu_count(), malloc, compile_model=name == "compiled")
          for name in names}


def print_variant(r: dict):
  """One variant's lines: bertjax per routing setting (tok/s, MFU, compile, first-step numerics, which library runs
  its dots), then PyTorch, with the ratio of each bertjax setting to it beside XLA's own routing's."""
  mfu = lambda x: f"MFU {x:.2f}" if x is not None else "MFU -"
  gib = lambda x: f", peak {x / 2**30:.1f} GiB" if x else ""
  print(f"{r['variant']:>6} batch {r['batch_size']} x {r['seq_len']} {r['dtype']}, {r['attention']} attention:",
        flush=True)
  ref = next(iter(r["bertjax"].values()))["first_step"]
  for name, j in r["bertjax"].items():
    diff = max(abs(j["first_step"][k] - ref[k]) / max(abs(ref[k]), 1e-12) for k in ref)
    libs = ", ".join(f"{lib} {row['flop_share']:.0%}" for lib, row in j["census"].items() if row["dots"])
    print(f"{'':>6} bertjax {name:<16} {j['tokens_per_sec']:8.0f} tok/s, {mfu(j['mfu'])}{gib(j['peak_memory_bytes'])}"
          f", compile {j['compile_seconds']:.0f}s, step-1 loss/grad-norm rel. diff {diff:.0e}; dot FLOPs: {libs}",
          flush=True)
  for name, t in r["torch"].items():
    print(f"{'':>6} PyTorch {name} ({t['head']} head) {t['tokens_per_sec']:8.0f} tok/s, {mfu(t['mfu'])}"
          + gib(t["peak_memory_bytes"]), flush=True)
    for jname, x in t["ratios"].items():
      note = {"default": " <- bertjax's default (runtime.CPU_XLA_FLAGS)",
              "xla": " <- XLA's own routing (before issue #35; BERTJAX_CPU_FLAGS=off)"}.get(jname, "")
      print(f"{'':>8} ratio bertjax {jname:<16} / PyTorch {name}: {x['ratio']:.2f}x [per-round {x['min']:.2f}-"
            f"{x['max']:.2f}] (FLOP-normalized {x['flop_normalized']:.2f}x){note}", flush=True)
  if "scaling" in r:
    s = r["scaling"]
    for framework, label in (("bertjax", "bertjax default"), ("torch", "PyTorch eager")):
      x = s[framework]
      print(f"{'':>6} thread scaling {label:<16}: {x['cores'][1]}-core step / {x['cores'][0]}-core step "
            f"{x['scaling']:.2f} [per-round {x['min']:.2f}-{x['max']:.2f}] (speed-up {1 / x['scaling']:.2f}x)",
            flush=True)
    verdict = "yes" if s["bertjax"]["scaling"] <= s["torch"]["scaling"] else "no"
    print(f"{'':>8} bertjax gains at least as much from the extra cores as PyTorch: {verdict}", flush=True)


def main(argv):
  del argv
  device = _DEVICE.value
  if device == "gpu":
    # Both frameworks share the GPU: JAX must not take 75% of its memory up front.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  runtime.setup()  # what every entry point does first: platform, host memory, JAX flags
  platform = jax.devices()[0].platform
  if device == "gpu" and platform != "gpu":
    raise SystemExit(f"error: --device=gpu, but JAX sees {platform} devices; install jax[cuda12] on a GPU machine")
  if _SCALING.value and device != "cpu":
    raise SystemExit("error: --scaling times one core against all of a CPU; leave out --device=gpu")
  names = list(cpu_routing.settings()) if _SETTINGS.value == ["all"] else _SETTINGS.value
  names = ["default"] if _SCALING.value else names
  unknown = [n for n in names if n not in cpu_routing.settings()]
  if unknown:
    raise SystemExit(f"error: --settings: unknown {unknown}; choose from {list(cpu_routing.settings())} or all")
  results, torch_peak = [], None
  peak = bench.matmul_peak() if device == "cpu" else flops.peak_flops(jax.devices()[0])
  for variant in _VARIANTS.value or DEFAULT_VARIANTS[device]:
    config = bert_config(variant, _BATCH.value, _SEQ.value, device)
    if _SCALING.value:
      sides, jax_side = scaling_sides(config, variant, _HEAD.value, _TORCH_MALLOC.value)
    else:
      sides = torch_sides(config, device, _HEAD.value, _THREADS.value, _TORCH_MALLOC.value, _COMPILE.value)
    eager = next(iter(sides.values()))
    if torch_peak is None:
      torch_peak = eager.matmul_peak() if device == "cpu" else peak
      print(f"device {jax.devices()[0].device_kind} / {eager.info['device']}, {os.cpu_count()} cores, torch "
            f"{eager.info['version']} ({eager.info['threads']} threads, malloc {_TORCH_MALLOC.value}), PyTorch head: "
            f"{_HEAD.value}; " + (f"2048^3 f32 matmul: XLA {peak / 1e9:.0f} GFLOP/s, PyTorch {torch_peak / 1e9:.0f} "
                                  "GFLOP/s" if device == "cpu" else f"dense bf16 peak {peak / 1e12:.0f} TFLOP/s"),
            flush=True)
      if device == "cpu":
        print("bertjax settings (one process each; ratio = bertjax tok/s / PyTorch tok/s at equal work, median of all "
              "steps, [min-max] of the per-round ratios):\n" + "\n".join(
                  f"  {n:<16} XLA_FLAGS={cpu_routing.settings()[n][0]!r}"
                  + (f" model {cpu_routing.settings()[n][1]}" if cpu_routing.settings()[n][1] else "") for n in names),
              flush=True)
    if not _SCALING.value:
      jax_side = jax_sides(config, variant, device, names)
    r = dict(variant=variant, **compare(config, _STEPS.value, _ROUNDS.value, sides, device, jax_side))
    if _SCALING.value:
      r["scaling"] = thread_scaling(r)
    for side in (*sides.values(), *jax_side.values()):
      side.close()
    results.append(r)
    print_variant(r)
  print(json.dumps(dict(device=device, peak=peak, torch_matmul_peak=torch_peak, torch_malloc=_TORCH_MALLOC.value,
                        torch_head=_HEAD.value, results=results)))


def _define_flags():
  """The script's flags, defined only when run as a program (tests import its functions)."""
  global _DEVICE, _VARIANTS, _BATCH, _SEQ, _HEAD, _COMPILE, _STEPS, _ROUNDS, _THREADS, _TORCH_MALLOC, _SETTINGS
  global _SCALING
  _DEVICE = flags.DEFINE_enum("device", "cpu", ["cpu", "gpu"], "where both sides run (gpu: bf16, see above)")
  _VARIANTS = flags.DEFINE_list("variants", [], "configs/bert.py variants to compare (default: per device)")
  _BATCH = flags.DEFINE_integer("batch_size", 0, "global batch size for every variant (0: SHAPES)")
  _SEQ = flags.DEFINE_integer("seq_len", 0, "sequence length (0: SHAPES)")
  _HEAD = flags.DEFINE_enum("torch_head", "masked", ["masked", "all"],
                            "PyTorch's MLM head: on the masked positions only, as bertjax (equal work), or on "
                            "every position (stock BertForPreTraining)")
  _COMPILE = flags.DEFINE_bool("torch_compile", True, "GPU: also time a torch.compile'd PyTorch (a second row)")
  _STEPS = flags.DEFINE_integer("steps", 5, "timed steps per side and round")
  _ROUNDS = flags.DEFINE_integer("rounds", 2, "rounds of alternating bertjax / PyTorch steps")
  _THREADS = flags.DEFINE_integer("threads", 0, "PyTorch intra-op threads (0: all cores, as XLA uses)")
  _SETTINGS = flags.DEFINE_list("settings", DEFAULT_SETTINGS,
                                "CPU: bertjax's routing settings, one process each (benchmarks/cpu_routing.py's "
                                "SETTINGS, or 'all'); `default` is what runtime.setup() sets, `xla` the routing before")
  _SCALING = flags.DEFINE_bool("scaling", False, "CPU: instead of the settings, time bertjax's default and PyTorch "
                               "each on one core and on every core, and print each one's thread scaling")
  _TORCH_MALLOC = flags.DEFINE_enum("torch_malloc", "default", ["default", "retain"],
                                    "the PyTorch process's glibc malloc policy (bertjax/core/runtime.py)")


if __name__ == "__main__":
  _define_flags()
  from bertjax.core import cli

  cli.run(cli.cli(main))
