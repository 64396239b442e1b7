"""`python -m bertjax.aot --config=configs/bert.py:large --topology=v4-32`: compile the real train step
for a TPU slice on this machine (no TPU needed: libtpu from the `tpu` extra compiles for a topology
description) and report per-device memory, FLOPs and XLA's step-time estimate, and whether it fits.
"""

import json
import os
import re

from absl import flags

from bertjax.core import runtime
from bertjax.core.cli import cli, config_and_phase_flags, run
from bertjax.core.errors import UserError


# Per generation: jax topology prefix, HBM per chip (GiB), how slice names count (cores or chips),
# chips per host, peak bf16 FLOP/s and HBM bytes/s per chip (Cloud TPU's published figures).
GENERATIONS = {
    "v4": dict(prefix="v4", hbm_gib=32, per_chip=2, chips_per_host=4, peak=275e12, hbm_bw=1.2e12),
    "v5p": dict(prefix="v5p", hbm_gib=95, per_chip=2, chips_per_host=4, peak=459e12, hbm_bw=2.76e12),
    "v5e": dict(prefix="v5e", hbm_gib=16, per_chip=1, chips_per_host=8, peak=197e12, hbm_bw=0.819e12),
    "v5litepod": dict(prefix="v5e", hbm_gib=16, per_chip=1, chips_per_host=8, peak=197e12, hbm_bw=0.819e12),
    "v6e": dict(prefix="v6e", hbm_gib=32, per_chip=1, chips_per_host=8, peak=918e12, hbm_bw=1.64e12),
}
# Chip grids for the slice sizes jax's topology descriptions accept (3-D tori for v4/v5p, 2-D for v5e/v6e).
GRIDS_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
            256: (4, 8, 8), 512: (8, 8, 8)}
GRIDS_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}


def parse_topology(name: str) -> dict:
  """'v4-32' -> generation facts, the number of chips and the jax topology name ('v4:2x4x2')."""
  m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name)
  if not m:
    raise UserError(f"unknown topology {name!r}; use e.g. v4-8, v4-32, v5e-8, v5e-16, v5p-8, v6e-8")
  gen = GENERATIONS[m.group(1)]
  chips = int(m.group(2)) // gen["per_chip"]
  grid = (GRIDS_3D if gen["prefix"] in ("v4", "v5p") else GRIDS_2D).get(chips)
  if grid is None:
    raise UserError(f"no chip grid known for {name} ({chips} chips); use a power-of-two slice such as v4-8 or v4-32")
  return dict(gen, name=name, chips=chips, grid=grid, topology=f"{gen['prefix']}:" + "x".join(map(str, grid)))


def topology_devices(t: dict):
  """The devices of a TPU slice description (compiling for them needs no TPU)."""
  from jax.experimental import topologies

  # libtpu reads the host's slice from these when it loads; on a machine without a TPU it would warn that
  # it cannot determine them. The compile target comes from the topology description below.
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", t["name"])
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  kwargs = {}
  if len(t["grid"]) == 3:
    host = (2, 2, 1)
    kwargs = dict(chip_config_name="megacore", chips_per_host_bounds=host, num_slices=1)
  try:
    return topologies.get_topology_desc(platform="tpu", topology_name=t["topology"], **kwargs).devices
  except Exception as e:
    raise UserError(f"could not describe TPU topology {t['topology']} ({str(e).splitlines()[0][:200]}); "
                    "install the TPU extra: pip install -e '.[tpu]'")


def _compile(config, mesh):
  """(build.Steps, the compiled train step) for `config` on `mesh`, from abstract state and batch."""
  import jax

  from bertjax.data.tokenizer import SPM_SPECIAL
  from bertjax.train import build

  steps = build.make_steps(config, mesh, SPM_SPECIAL, build.placeholder_counts(config))
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=steps.batch_sharding)
           for k, v in build.host_batch_spec(config, config.batch_size).items()}
  return steps, steps.train.lower(steps.abstract_state, batch).compile()


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def _depth_extrapolated_cost(config, mesh) -> dict:
  """XLA's cost of the train step at the config's depth, for a model whose layers run as a rolled scan.

  XLA costs a loop body once (and may estimate no time for a program with a loop), and compiling every
  layer unrolled takes long for deep models. Layers are identical, so the cost is linear in depth:
  compile the step unrolled at depths g and 2g (g = ALBERT's groups, else 1) and extrapolate."""
  g = config.model.num_hidden_groups if config.model.sharing != "none" else 1
  costs = []
  for depth in (g, 2 * g):
    c = config.copy_and_resolve_references()
    c.model.num_layers = c.model.scan_unroll = depth
    costs.append(_cost(_compile(c, mesh)[1]))
  scale = (config.model.num_layers - g) / g
  extrapolated = {}
  for k in ("flops", "optimal_seconds", "bytes accessed"):
    a, b = costs[0].get(k, -1.0), costs[1].get(k, -1.0)
    if 0 < a < b:  # XLA's TPU cost analysis can come out negative or shrink with depth: then it is unusable
      extrapolated[k] = a + scale * (b - a)
  return extrapolated


def compile_for(config, t: dict, unrolled_estimate: bool = True) -> dict:
  """Lowers and compiles the real train step for topology `t`; returns the figures. With
  `unrolled_estimate`, XLA's FLOPs and step time of a scanned model come from `_depth_extrapolated_cost`."""
  from bertjax.core import sharding
  from bertjax.model import attention as attention_lib, flops
  from bertjax.model.hparams import layers_per_iteration
  from bertjax.train import build

  if config.get("teacher"):  # a distillation config: the Distiller plugs into the factory from above
    from bertjax.compress import transfer  # noqa: F401 (registers distillation and MobileBERT's transfer)

  notes = []
  if config.model.attention in attention_lib.WITHOUT_DROPOUT and config.model.attention_dropout > 0:
    # What the kernel would train: a run with it must set attention_dropout=0 (config validation says so).
    config = config.copy_and_resolve_references()
    notes.append(f"model.attention={config.model.attention} applies no attention dropout: compiled with "
                 f"attention_dropout=0 (was {config.model.attention_dropout}; training needs "
                 "--config.model.attention_dropout=0)")
    config.model.attention_dropout = 0.0
  build.validate(config)
  # One JAX device per chip (v4/v5p megacore; v5e/v6e have one core a chip): checked before libtpu is asked.
  micro = config.batch_size // config.grad_accum_steps
  if config.batch_size % t["chips"] or micro % t["chips"]:
    raise UserError(f"batch_size={config.batch_size} (microbatch {micro} of grad_accum_steps={config.grad_accum_steps}) "
                    f"is not divisible by the {t['chips']} devices of {t['name']}; use a batch and grad_accum_steps "
                    "whose microbatch is a multiple of the device count")
  devices = topology_devices(t)
  mesh = sharding.make_mesh(config.sharding, devices=devices, overrides=dict(config.mesh))
  notes.append(build.attention_notice(config, mesh))
  head = dict(topology=t["name"], jax_topology=t["topology"], devices=len(devices), mesh=dict(mesh.shape),
              sharding=config.sharding, global_batch=config.batch_size, seq_len=config.seq_len,
              hbm_gib=t["hbm_gib"], notes=notes)
  try:
    steps, compiled = _compile(config, mesh)
  except Exception as e:  # the TPU compiler refuses a program that cannot fit: a result, not a crash
    oom = re.search(r"Ran out of memory.*?required for (.+?) \(([\d.]+)([KMGT])\) exceeds available HBM", str(e))
    if oom is None:
      raise
    needed = float(oom.group(2)) * 1024.0 ** "KMGT".index(oom.group(3)) / 1024**2
    return dict(head, fits=False, needed_gib=needed, needed_for=oom.group(1))
  mem = compiled.memory_analysis()
  cost, cost_of = _cost(compiled), "train step"
  if unrolled_estimate and layers_per_iteration(steps.model.cfg) < steps.model.cfg.num_layers:
    cost, cost_of = _depth_extrapolated_cost(config, mesh), "train step, extrapolated from unrolled depths"
  gib = 1024**3
  args, temp, out, alias = (getattr(mem, f"{k}_size_in_bytes", 0) for k in ("argument", "temp", "output", "alias"))
  total = args + temp + out - alias
  # v4/v5p megacore: one JAX device per chip, so the device has the chip's whole HBM.
  hbm = t["hbm_gib"] * gib
  flops_per_token = flops.model_train_flops_per_token(steps.model, config.seq_len, steps.cfg.masking.max_predictions,
                                                      steps.cfg.masking.max_shuffled)
  tokens = config.batch_size * config.seq_len
  model_step_flops = flops_per_token * tokens
  peak = t["peak"] * t["chips"]
  est = cost.get("optimal_seconds", 0.0)
  return dict(
      head,
      arguments_gib=args / gib, temporaries_gib=temp / gib, outputs_gib=out / gib, aliased_gib=alias / gib,
      total_gib=total / gib, fits=total <= hbm,
      xla_flops_per_device=float(cost["flops"]) if cost.get("flops", 0) > 0 else None, xla_cost_of=cost_of,
      model_flops_per_step=model_step_flops,
      xla_estimated_step_seconds=float(est) if est and est > 0 else None,
      roofline_step_seconds_at_100pct_mfu=model_step_flops / peak,
      # Per device: XLA's FLOPs at the chip's peak or XLA's bytes at its HBM bandwidth, whichever is slower.
      roofline_step_seconds_xla=(max(cost["flops"] / t["peak"], cost.get("bytes accessed", 0) / t["hbm_bw"])
                                 if cost.get("flops", 0) > 0 else None),
  )


_TRY = "try --config.sharding=fsdp, --config.model.remat=full, a smaller --config.batch_size or --config.grad_accum_steps"


def format_report(r: dict) -> str:
  title = "\n".join(r["notes"] + [f"topology {r['topology']} ({r['jax_topology']}, {r['devices']} devices), mesh "
                                   f"{r['mesh']}, preset {r['sharding']}, batch {r['global_batch']} x {r['seq_len']}"])
  if "needed_gib" in r:  # the compiler refused it
    return (f"{title}\nDOES NOT FIT: the TPU compiler needs {r['needed_gib']:.1f} GiB per device for "
            f"{r['needed_for']}, has {r['hbm_gib']:.0f} GiB HBM; {_TRY}")
  lines = [
      title,
      f"per-device memory: arguments {r['arguments_gib']:.2f} GiB + temporaries {r['temporaries_gib']:.2f} GiB "
      f"+ outputs {r['outputs_gib']:.2f} GiB - aliased {r['aliased_gib']:.2f} GiB = {r['total_gib']:.2f} GiB "
      f"of {r['hbm_gib']:.0f} GiB HBM",
      f"FLOPs per step: {r['model_flops_per_step']:.3e} (model), "
      + (f"{r['xla_flops_per_device']:.3e} per device (XLA, {r['xla_cost_of']})" if r["xla_flops_per_device"]
         else f"XLA's count unusable ({r['xla_cost_of']})"),
  ]
  est = r["xla_estimated_step_seconds"]
  lines.append(f"XLA estimated step time: {est:.4f} s" if est else
               "XLA estimated step time: none (XLA's cost analysis gave no positive estimate for this program)")
  lines.append(f"step time at 100% MFU: {r['roofline_step_seconds_at_100pct_mfu']:.4f} s (model FLOPs at peak)")
  if r["roofline_step_seconds_xla"]:
    lines.append(f"roofline step time: {r['roofline_step_seconds_xla']:.4f} s (XLA's FLOPs at peak or its bytes "
                 "at HBM bandwidth, per device)")
  lines.append("FITS" if r["fits"] else f"DOES NOT FIT: needs {r['total_gib']:.1f} GiB per device, "
               f"has {r['hbm_gib']:.0f}; {_TRY}")
  return "\n".join(lines)


def _define_flags():
  """The CLI's flags, defined only when run as a program (so `import bertjax.aot` defines none)."""
  config = config_and_phase_flags("configs/bert.py:large", "compile")
  topology = flags.DEFINE_string("topology", "v4-8", "TPU slice: v4-8, v4-32, v5e-8, v5e-16, v5p-8, v6e-8, ...")
  as_json = flags.DEFINE_bool("json", False, "print one JSON object instead of the table")
  unrolled = flags.DEFINE_bool("unrolled_estimate", True, "XLA's FLOPs and step-time estimate for a model whose "
                               "layers run as a rolled scan (XLA costs a loop body once): from two shallow unrolled compiles")
  return config, topology, as_json, unrolled


@cli
def main(argv):
  del argv
  # Compiling *for* a TPU topology needs libtpu but no TPU: JAX itself runs on the CPU, libtpu is asked
  # only for the topology description and the compiler (set before JAX starts a backend).
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # not on a TPU VM: don't wait for its metadata server
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other JAX processes here may hold libtpu
  import jax

  jax.config.update("jax_platforms", "cpu")
  runtime.setup()
  config, topology, as_json, unrolled = _FLAGS
  report = compile_for(config(), parse_topology(topology.value), unrolled.value)
  print(json.dumps(report) if as_json.value else format_report(report))


if __name__ == "__main__":
  _FLAGS = _define_flags()
  run(main)
