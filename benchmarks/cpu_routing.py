"""Where XLA:CPU runs bertjax's matmuls, and what each routing lever is worth: train steps timed side by side.

Each setting (a set of XLA flags, or a model switch) compiles the same step in a process of its own (XLA reads
XLA_FLAGS once, when its CPU backend starts), all from the same initial state and batch. Their steps then
alternate in short rounds, so every setting sees the same machine load (other jobs on a shared CPU), and the
script prints, per workload: each setting's tokens/s as a ratio to XLA's own routing (`xla`: YNNPACK, with
Eigen for what YNNPACK rejects) with the spread of the per-round ratios, its compile time, the loss and
gradient norm of its first step (numerics: every setting starts from the same state and batch), and the
dot census of its compiled step (`bertjax.train.census`: dots and FLOPs per library). Then one JSON line.

Settings (SETTINGS below): `xla` (XLA's own routing and a rolled layer scan: the step before issue #35),
`default` (bertjax's CPU defaults now: `runtime.CPU_XLA_FLAGS` and every layer unrolled), `unrolled` (only the
unrolled layers, flags and dense_grad as `xla`), and each lever of issue #35 alone and combined. Workloads: the
pretraining train step of BERT tiny (batch 32 x 128) and base (8 x 128), float32, and a BERT-base
sentence-classification fine-tuning step (32 x 128).

  python benchmarks/cpu_routing.py                                   # every workload, the main settings
  python benchmarks/cpu_routing.py --workloads=base --settings=xla,default,ynn_eltwise --rounds=6
  python benchmarks/cpu_routing.py --workloads=tiny --settings=all --steps=3
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bertjax.core import config as config_lib, runtime  # noqa: E402
from bertjax.model import hparams  # noqa: E402
from bertjax.train import bench  # noqa: E402

_ONEDNN = "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type="
_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="
# name -> (XLA_FLAGS, model overrides). `default` is filled in from runtime.CPU_XLA_FLAGS.
# ROLLED: the encoder's own choice of how many layers a scan iteration runs (all up to 4, else 1), the CPU's too
# before issue #35 made the CPU unroll every layer (bertjax.model.config.scan_unroll).
ROLLED = "rolled"
SETTINGS = {
    # The step before issue #35: XLA's own routing and a rolled layer scan, whatever bertjax's defaults become.
    "xla": ("", {"model.dense_grad": "xla", "model.scan_unroll": ROLLED}),
    "unrolled": ("", {"model.dense_grad": "xla", "model.scan_unroll": 0}),  # only the CPU's unrolled layers
    "onednn": (f"{_ONEDNN}dot {_YNN_OFF}", {}),
    "onednn_eltwise": (f"{_ONEDNN}dot,eltwise {_YNN_OFF}", {}),
    "onednn_ynn": (f"{_ONEDNN}dot", {}),
    "ynn_eltwise": ("--xla_cpu_experimental_ynn_fusion_type=+dot,+eltwise", {}),
    "ynn_dgrad": ("", {"model.dense_grad": "transposed"}),
    "ynn_dgrad_eltwise": ("--xla_cpu_experimental_ynn_fusion_type=+dot,+eltwise", {"model.dense_grad": "transposed"}),
    "vw512": ("--xla_cpu_prefer_vector_width=512", {}),
    # YNNPACK for each dot alone (no elementwise producers, consumers or reductions in its fusion), and YNNPACK off
    # (Eigen for every dot).
    "ynn_individual": ("--xla_cpu_experimental_ynn_fusion_type=individual_dot", {}),
    "eigen": (_YNN_OFF, {}),
    # Issue #49's dropout lever, taken back: the reference Threefry masks instead of the CPU's lowbias32.
    "threefry_masks": ("", {"model.dropout_rng": "threefry"}),
    "onednn_vw512": (f"{_ONEDNN}dot {_YNN_OFF} --xla_cpu_prefer_vector_width=512", {}),
}
MAIN_SETTINGS = ["xla", "default", "unrolled", "onednn", "onednn_eltwise", "ynn_eltwise", "ynn_dgrad", "vw512"]
WORKLOADS = {"tiny": ("pretrain", "tiny", 32), "base": ("pretrain", "base", 8), "finetune": ("finetune", "base", 32),
             "finetune_tiny": ("finetune", "tiny", 32)}


def settings() -> dict:
  """SETTINGS with `default`: the flags runtime.setup() adds on the CPU."""
  flags = " ".join(f"{name}={value}" for name, value in runtime.CPU_XLA_FLAGS)
  return {"default": (flags, {}), **SETTINGS}


def pretrain_config(variant: str, batch: int, seq_len: int, overrides: dict):
  """configs/bert.py's variant at one shape, float32 (the CPU's dtype), with the setting's model overrides."""
  config = config_lib.load(os.path.join(REPO, f"configs/bert.py:{variant}"))
  config.batch_size, config.seq_len, config.phases, config.model.dtype = batch, seq_len, (), "float32"
  return with_overrides(config, overrides)


def with_overrides(config, overrides: dict):
  """`config` with a setting's model overrides ("section.key": value) set."""
  for key, value in overrides.items():
    section, leaf = key.split(".")
    if value == ROLLED:  # what the encoder picks when the platform does not (model.config.scan_unroll)
      value = hparams.default_unroll(config.model.num_layers)
    config[section][leaf] = value
  return config


def finetune_job(variant: str, batch: int, seq_len: int, overrides: dict) -> bench.Job:
  """bertjax.finetune.train's step (AdamW, dropout 0.1) on a 2-class sentence-pair classifier over the variant's
  encoder, random weights, a synthetic batch of full-length rows."""
  import functools

  import jax
  import numpy as np

  from bertjax.finetune import train
  from bertjax.finetune.classification import task as classification
  from bertjax.finetune.classification.model import Classifier
  from bertjax.model import config as model_config
  from bertjax.train import optim

  config = pretrain_config(variant, batch, seq_len, overrides)
  cfg = model_config.encoder_config(config.model)
  model = Classifier(cfg, 2, 0.1, deterministic=False)
  rows = bench.synthetic_batch(config, batch)
  data = dict(input_ids=rows["input_ids"], type_ids=rows["type_ids"], groups=rows["groups"],
              label=rows["sentence_label"], example_weight=rows["example_weight"])
  params = jax.jit(model.init)(jax.random.key(0), data["input_ids"], data["type_ids"], data["groups"])["params"]
  tx = optim.make(config.optimizer, 2e-5)
  opt_state = tx.init(params)
  step = jax.jit(functools.partial(train.train_step, model=model, tx=tx, task_loss=classification.loss),
                 donate_argnums=(0, 1))
  args = (np.uint32(0), np.int32(0))
  t0 = time.perf_counter()
  compiled = step.lower(params, opt_state, data, *args).compile()
  seconds = time.perf_counter() - t0
  out = {}

  def run(state):
    p, o, out["loss"] = compiled(*state, data, *args)
    jax.block_until_ready((p, o, out["loss"]))
    return p, o

  def scalars(state):
    norm = lambda tree: float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree))))
    return dict(loss=float(out["loss"]), param_norm=norm(state[0]))

  return bench.Job(run, (params, opt_state), batch * seq_len, seconds, compiled.as_text(), scalars)


def pretrain_job(variant: str, batch: int, seq_len: int, overrides: dict) -> bench.Job:
  return bench.pretrain_job(pretrain_config(variant, batch, seq_len, overrides))


def compare(workload: str, names: list, steps: int, rounds: int, seq_len: int) -> dict:
  """The settings' steps of one workload, alternating; per setting the median tokens/s, its ratio to the
  first setting's (and the spread of the per-round ratios), compile seconds, first-step numerics, census."""
  kind, variant, batch = WORKLOADS[workload]
  table = settings()
  make = finetune_job if kind == "finetune" else pretrain_job
  procs = {}
  for name in names:
    flags, overrides = table[name.split("#")[0]]
    env = {"XLA_FLAGS": flags, runtime.CPU_FLAGS_ENV: "off"}
    procs[name] = bench.StepProcess(make, (variant, batch, seq_len, overrides), env)
  times = {name: [] for name in names}
  per_round = {name: [] for name in names}
  for p in procs.values():
    p.steps(1)  # warm-up
    p.cpu_seconds, p.cpu_steps = 0.0, 0
  for r in range(rounds):
    order = names if r % 2 == 0 else names[::-1]  # alternate who goes first
    for name in order:
      time.sleep(0.5)  # let the last setting's worker threads go idle
      t = procs[name].steps(steps)
      times[name] += t
      per_round[name].append(statistics.median(t))
  tokens = batch * seq_len
  base = names[0]
  out = dict(workload=workload, kind=kind, variant=variant, batch_size=batch, seq_len=seq_len, settings={})
  for name in names:
    info = procs[name].info
    ratios = [per_round[base][i] / per_round[name][i] for i in range(rounds)]
    out["settings"][name] = dict(
        xla_flags=table[name.split("#")[0]][0], model=table[name.split("#")[0]][1],
        tokens_per_sec=tokens / statistics.median(times[name]),
        ratio=statistics.median(times[base]) / statistics.median(times[name]), ratio_min=min(ratios),
        ratio_max=max(ratios), compile_seconds=info["compile_seconds"], first_step=info["first_step"],
        census=info["census"]["libraries"], slow_path=len(info["census"]["slow_path"]),
        cpu_seconds_per_step=procs[name].cpu_seconds / max(1, procs[name].cpu_steps))
    procs[name].close()
  return out


def report(r: dict) -> str:
  """One workload's table: ratio to the first setting (its spread over rounds), tok/s, compile, numerics, census."""
  names = list(r["settings"])
  ref = r["settings"][names[0]]["first_step"]
  lines = [f"{r['workload']}: {r['kind']} step of BERT-{r['variant']}, batch {r['batch_size']} x {r['seq_len']} "
           f"float32; ratio = tokens/s over '{names[0]}' (median of all steps, [min, max] of per-round ratios); "
           f"cpu/step = its CPU seconds per step over '{names[0]}''s, lower is better (all threads; less sensitive to "
           "other jobs' load)"]
  cpu_ref = r["settings"][names[0]]["cpu_seconds_per_step"]
  for name, s in r["settings"].items():
    diff = max(abs(s["first_step"][k] - ref[k]) / max(abs(ref[k]), 1e-12) for k in ref)
    libs = ", ".join(f"{lib} {row['dots']} dots/{row['flop_share']:.0%}" for lib, row in s["census"].items()
                     if row["dots"])
    lines.append(f"  {name:<18} {s['ratio']:5.2f}x [{s['ratio_min']:.2f}, {s['ratio_max']:.2f}] "
                 f"cpu/step {s['cpu_seconds_per_step'] / cpu_ref:4.2f}x "
                 f"{s['tokens_per_sec']:8.0f} tok/s  compile {s['compile_seconds']:5.1f}s  "
                 f"step-1 rel. diff {diff:.1e}  dots: {libs}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workloads", default="tiny,base,finetune", help=f"comma-separated: {', '.join(WORKLOADS)}")
  parser.add_argument("--settings", default=",".join(MAIN_SETTINGS),
                      help="comma-separated names of SETTINGS (the first is the reference), or 'all'; NAME#2 runs "
                      "a setting twice (an A/A control: its ratio to NAME shows the harness's own spread)")
  parser.add_argument("--steps", type=int, default=3, help="timed steps per setting and round")
  parser.add_argument("--rounds", type=int, default=4, help="rounds of alternating settings")
  parser.add_argument("--seq_len", type=int, default=128)
  args = parser.parse_args()
  names = list(settings()) if args.settings == "all" else args.settings.split(",")
  unknown = [n for n in names if n.split("#")[0] not in settings()]
  if unknown:
    raise SystemExit(f"error: unknown settings {unknown}; choose from {list(settings())}")
  results = []
  for workload in args.workloads.split(","):
    r = compare(workload, names, args.steps, args.rounds, args.seq_len)
    print(report(r), flush=True)
    results.append(r)
  print(json.dumps(dict(cpu_count=os.cpu_count(), results=results)))


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
