"""Compile time of the train step against depth: BERT 12 vs 24 layers, ALBERT base vs large sharing all / none.

Layers run under `nn.scan`, so the compiled program holds one layer body whatever the depth and compile
time should stay nearly flat (the issue's target: 24 layers at most 1.3x the 12-layer time). Each row
traces, lowers and compiles the real jitted train step (no state is allocated) on the default backend, with
the layer loop rolled (`model.scan_unroll=1`: what a GPU or TPU runs at these depths; the CPU unrolls by default);
the two models of a pair are compiled alternately `--repeats` times and the fastest of each is kept.

  python benchmarks/compile_scaling.py                   # batch 8 x 128, the configs' own dtype
  python benchmarks/compile_scaling.py --repeats=2 --dtype=float32
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
from absl import flags

from bertjax.core import config as config_lib, runtime
from bertjax.train import bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (name, shallow config, deep config, model overrides)
PAIRS = (
    ("BERT base -> large", "configs/bert.py:base", "configs/bert.py:large", {}),
    ("ALBERT base -> large, sharing=all", "configs/albert.py:base", "configs/albert.py:large", {"sharing": "all"}),
    ("ALBERT base -> large, sharing=none", "configs/albert.py:base", "configs/albert.py:large", {"sharing": "none"}),
)
_BATCH = flags.DEFINE_integer("batch_size", 8, "global batch size")
_SEQ = flags.DEFINE_integer("seq_len", 128, "sequence length")
_REPEATS = flags.DEFINE_integer("repeats", 1, "compiles per model (the fastest is kept)")
_DTYPE = flags.DEFINE_string("dtype", "", "compute dtype override (float32 | bfloat16); empty: the config's")


def load(spec: str, overrides: dict):
  config = config_lib.load(os.path.join(REPO, spec))
  config.model.update(overrides)
  # The rolled layer loop, as accelerators run deep models: the CPU now unrolls every layer by default
  # (bertjax.model.config.scan_unroll), trading compile time for step time; `scan_unroll=1` keeps one body.
  config.model.scan_unroll = config.model.scan_unroll or 1
  config.seq_len = _SEQ.value
  if _DTYPE.value:
    config.model.dtype = _DTYPE.value
  return config


def compile_seconds(config) -> float:
  """Seconds to trace, lower and compile the config's train step at the benchmark's batch size."""
  _, seconds = bench.compile_step(bench.setup(config, _BATCH.value))
  return seconds


def main(argv):
  del argv
  runtime.setup()  # what every entry point does first: platform, host memory, JAX flags
  # A first compile pays one-time costs (LLVM and backend start-up); keep them out of the first row.
  compile_seconds(load("configs/bert.py:tiny", {}))
  rows = []
  for name, shallow_spec, deep_spec, overrides in PAIRS:
    shallow, deep = load(shallow_spec, overrides), load(deep_spec, overrides)
    times = {"shallow": [], "deep": []}
    for _ in range(_REPEATS.value):
      times["shallow"].append(compile_seconds(shallow))
      times["deep"].append(compile_seconds(deep))
    s, d = min(times["shallow"]), min(times["deep"])
    rows.append(dict(pair=name, shallow_layers=shallow.model.num_layers, deep_layers=deep.model.num_layers,
                     shallow_seconds=s, deep_seconds=d, ratio=d / s))
    print(f"{name:<36} {shallow.model.num_layers:>2} layers {s:6.1f} s | {deep.model.num_layers:>2} layers "
          f"{d:6.1f} s | ratio {d / s:.2f}", flush=True)
  print(json.dumps(dict(device=jax.devices()[0].device_kind, batch_size=_BATCH.value, seq_len=_SEQ.value,
                        rows=rows)))


if __name__ == "__main__":
  from bertjax.core import cli

  cli.run(cli.cli(main))
