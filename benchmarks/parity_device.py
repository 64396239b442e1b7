"""`--device` for the parity benchmarks (finetune_parity.py, ner_parity.py, qa_parity.py): where both sides run.

cpu (the default) changes nothing: PyTorch on the CPU and JAX on its default platform, each with its own
defaults, exactly as before the flag existed. gpu: both sides on the one NVIDIA GPU in float32 with the same
arithmetic, so a difference is the implementations' and not the precision's: transformers on cuda with TF32 off
(torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 False; PyTorch's own default for matmuls, set
explicitly), JAX on its GPU with jax_default_matmul_precision "highest" (XLA otherwise computes float32 dots in
TF32 on Ampere and later GPUs). JAX allocates on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false) so that it leaves
PyTorch, and a second benchmark process, room on the same GPU. No GPU: one line naming what is missing, exit 1.

`piece` keeps each finished side of each seed under the run's work directory, keyed by the recipe's flags, so a
recipe too long for one session (a whole-split SQuAD v2.0 side is 1.5 hours on 2 CPU cores, SST-2's whole set
longer) goes on in the next: a rerun of the same command reads the finished pieces back and runs only the rest.
"""

import hashlib
import json
import os
import sys

DEVICES = ("cpu", "gpu")


def add_flag(parser) -> None:
  """Adds --device (cpu | gpu) and --bucket_lengths to a benchmark's argument parser."""
  parser.add_argument("--device", default="cpu", choices=DEVICES,
                      help="cpu: as before (PyTorch on the CPU, JAX on its default platform); gpu: both sides on the "
                           "NVIDIA GPU in float32 (TF32 off in PyTorch, matmul precision highest in JAX)")
  # bertjax compiles its training step once per length bucket: on the CPU a compile is a few seconds, on an H200 at
  # float32 "highest" the MiniLM step took 45-50 s each (2026-11-28), so SQuAD's 12 fitted buckets at 384 were ten
  # minutes of compiles; none (every batch padded to seq_len) is one compile where padding costs little.
  parser.add_argument("--bucket_lengths", default="auto",
                      help="bertjax's bucket_lengths (auto: fitted, seq_len / 32 of them; none: one shape; or 64,128)")


SEED_FLAGS = ("seeds", "first_seed")  # which seeds run: never part of a piece's recipe


def add_seed_flags(parser, seeds: int) -> None:
  """Adds --seeds (how many paired seeds, default `seeds`) and --first_seed (where they start), so one seed that did
  not fit a session runs alone in the next and draws what it would have drawn among the others."""
  parser.add_argument("--seeds", type=int, default=seeds)
  parser.add_argument("--first_seed", type=int, default=0,
                      help="run seeds first_seed .. first_seed + seeds - 1 (a seed that did not fit one session, alone)")


def configure(config, args):
  """Sets the bertjax fine-tuning `config`'s fields that these flags choose (where `args` has them: other scripts
  build these configs from their own flags); returns it."""
  if getattr(args, "bucket_lengths", None):
    config.bucket_lengths = args.bucket_lengths
  return config


def recipe(args, selection) -> tuple[dict, str]:
  """(recipe, HASH): every flag of `args` except the seed flags and the script's `selection` ones (which tasks or
  modes run, and where reports go: they do not change a result), and a short hash of them."""
  flags = {k: v for k, v in vars(args).items() if k not in SEED_FLAGS + tuple(selection)}
  return flags, hashlib.sha1(json.dumps(flags, sort_keys=True, default=str).encode()).hexdigest()[:10]


def piece(workdir: str, name: str, args, selection, run):
  """`run()`'s result (JSON: numbers, lists, dicts), stored as workdir/pieces/NAME-HASH.json (HASH: `recipe`'s); an
  existing file is read back instead of running again. Delete it to rerun."""
  flags, digest = recipe(args, selection)
  path = os.path.join(workdir, "pieces", f"{name}-{digest}.json")
  if os.path.exists(path):
    print(f"{name}: reusing the finished piece {path}", flush=True)
  else:
    result = run()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:  # numpy scalars and arrays among the results become numbers and lists
      json.dump(dict(recipe=flags, result=result), f, indent=1, default=lambda v: v.tolist())
    os.replace(path + ".tmp", path)  # a run killed while writing leaves no half piece
  with open(path) as f:
    return json.load(f)["result"]  # the same types whether it ran now or earlier


def setup(device: str) -> str:
  """Prepares both frameworks for `device` and returns the torch device name ("cpu" or "cuda"). Call it after
  bertjax.core.runtime.setup() and before JAX runs anything (the allocator setting is read when its backend
  starts). Exits with a one-line error when --device=gpu finds no GPU on either side."""
  if device == "cpu":
    return "cpu"
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # PyTorch shares the GPU
  import jax
  import torch

  try:
    platform = jax.devices()[0].platform
  except RuntimeError as e:  # JAX_PLATFORMS names a platform that has no devices here
    platform = f"no backend ({str(e).splitlines()[0]})"
  if platform != "gpu":
    chosen = f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']}" if os.environ.get("JAX_PLATFORMS") else "JAX_PLATFORMS unset"
    sys.exit(f"error: --device=gpu but JAX runs on {platform} ({chosen}); run on an NVIDIA GPU with jax's CUDA plugin "
             "and JAX_PLATFORMS unset, or pass --device=cpu")
  if not torch.cuda.is_available():
    sys.exit("error: --device=gpu but torch.cuda.is_available() is False (a CPU-only torch build or no driver); "
             "install torch with CUDA, or pass --device=cpu")
  jax.config.update("jax_default_matmul_precision", "highest")
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  return "cuda"
