"""Shared test fixtures: a private tokenizer cache, one XLA compilation cache, and small configs."""

import getpass
import os
import re
import tempfile

import pytest

# The suite compiles the same micro models many times over (every xdist worker, every CLI subprocess):
# one persistent XLA cache for all of them compiles each program once. Set before JAX is imported, and
# inherited by subprocesses through the environment.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"bertjax-tests-xla-cache-{getpass.getuser()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Cold, the suite is mostly XLA:CPU compiling micro models whose steps then run for milliseconds: without
# LLVM's optimization passes each compile takes ~25% less time. Numerics do not depend on it (the parity tests
# hold to the same tolerances); benchmarks and users keep the default level.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

# Under xdist each worker has one core: the PyTorch references (and NumPy's BLAS) would otherwise spin two
# OpenMP threads per worker against the other worker's compiles, which made a 20-step parity test 2x slower.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
  os.environ.setdefault("OMP_NUM_THREADS", "1")
  os.environ.setdefault("MKL_NUM_THREADS", "1")

from bertjax.core import config as config_lib, runtime  # noqa: E402

runtime.setup()  # as every entry point does, before JAX runs anything

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
  """Keeps tokenizers trained by tests out of the user's ~/.cache (and shares them across tests)."""
  os.environ["BERTJAX_CACHE"] = str(tmp_path_factory.mktemp("bertjax-cache"))


def encoder_only(cfg):
  """Embeddings and encoder of `cfg` (an EncoderConfig), no heads: apply(variables, ids, groups) -> hidden."""
  from flax import linen as nn
  import jax.numpy as jnp

  from bertjax.model.embeddings import Embeddings
  from bertjax.model.encoder import Encoder

  class EncoderOnly(nn.Module):
    cfg: object

    @nn.compact
    def __call__(self, ids, groups):
      x = Embeddings(self.cfg)(ids, jnp.zeros_like(ids), True)
      return Encoder(self.cfg)(x, groups)

  return EncoderOnly(cfg)


def load_config(spec: str):
  return config_lib.load(os.path.join(REPO, spec))


def micro(spec: str = "configs/bert.py:tiny", **overrides):
  """A config's tiny variant shrunk further so a few steps compile and run in seconds."""
  c = load_config(spec)
  c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 64, 2, 128
  if c.model.embedding_size:
    c.model.embedding_size = 32
  c.batch_size, c.seq_len, c.data.dupe_factor = 16, 64, 1
  c.total_steps, c.warmup_steps, c.log_every, c.eval_every, c.checkpoint_every = 30, 5, 10, 30, 30
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  if "warmup_steps" not in overrides:
    c.warmup_steps = min(c.warmup_steps, c.total_steps)
  return c


def devices(n: int) -> dict:
  """The environment for a subprocess that sees `n` CPU devices (with the suite's XLA flags)."""
  return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n} {TEST_XLA_FLAGS}"}


# CLI flags that shrink configs/bert.py:tiny for subprocess tests (the same shapes as `micro`).
MICRO_FLAGS = ("--config.model.hidden_size=64", "--config.model.intermediate_size=128", "--config.seq_len=64",
               "--config.batch_size=16", "--config.data.dupe_factor=1", "--config.warmup_steps=1")


def train_cli(workdir, *flags, spec="configs/bert.py:tiny", env=None, wait=True, timeout=900):
  """Runs `python -m bertjax.train` on a micro config; returns the CompletedProcess (or Popen if not wait)."""
  import subprocess
  import sys

  cmd = [sys.executable, "-m", "bertjax.train", f"--config={spec}", f"--workdir={workdir}", *MICRO_FLAGS, *flags]
  env = dict(os.environ, **(env or {}))
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def read_metrics(workdir):
  import json

  with open(os.path.join(str(workdir), "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


# The modules whose tests run longest (multi-process runs, TPU compiles, killed and resumed runs) start first,
# so that no worker is left running one of them alone at the end of the suite.
LONGEST_FIRST = ("test_multihost.py", "test_sharding.py", "test_aot.py", "test_checkpoint.py", "test_notebook.py")


def pytest_collection_modifyitems(items):
  rank = lambda item: LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST else len(LONGEST_FIRST)
  items.sort(key=rank)  # stable: the rest keep their order


def layer_shapes(params) -> set:
  """The shapes of `params`' stacked layer leaves, the stack's and one layer's, unit dimensions dropped."""
  import jax

  from bertjax.model.layer import is_stacked

  shapes = set()
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    if is_stacked(path):
      shapes |= {tuple(d for d in x.shape if d != 1), tuple(d for d in x.shape[1:] if d != 1)}
  return shapes


def layer_copies(hlo: str, shapes: set) -> int:
  """Slices and concatenations (static or dynamic) in compiled HLO whose result has one of `shapes`
  (`layer_shapes`; unit dimensions ignored: a layer's slice reads as [1, ...])."""
  drop_ones = lambda dims: tuple(int(d) for d in dims.split(",") if d and int(d) != 1)
  ops = re.findall(r"= \w+\[([\d,]*)\]\S* (slice|dynamic-slice|concatenate|dynamic-update-slice)\(", hlo)
  return sum(drop_ones(dims) in shapes for dims, _ in ops)


def tiny_hf_checkpoint(tmp_path, vocab) -> str:
  """A randomly initialized micro BERT written as an HF checkpoint with a WordPiece vocab of `vocab` (a list of
  tokens): what the fine-tuning task tests start from."""
  from bertjax.data.tokenizer_spec import load_tokenizer
  from bertjax.hf import convert

  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  pre = micro("configs/bert.py:tiny")
  pre.model.vocab_size = len(vocab)
  ckpt = str(tmp_path / "hf")
  convert.write_hf(pre, convert.init_params(pre, seed=0), ckpt, load_tokenizer(f"wordpiece:{tmp_path / 'vocab.txt'}"))
  return ckpt


def toy_graphs(sentences, n: int, target: str, seed: int = 0) -> list:
  """`n` JSONL lines of graphs of 2-4 passages (sentences) with random links, in bertjax.finetune.graph's layout:
  classification (label "1" when some passage links to the first) or span (which word follows X? in one passage)."""
  import json
  import random

  rng, rows = random.Random(seed), []
  for i in range(n):
    texts = rng.sample(sentences, rng.randint(2, 4))
    ids = [f"p{k}" for k in range(len(texts))]
    links = sorted({(rng.choice(ids), rng.choice(ids)) for _ in range(rng.randint(0, 3))})
    row = dict(id=f"g{i}", passages=[dict(id=p, text=t) for p, t in zip(ids, texts)], links=[list(l) for l in links])
    if target == "classification":
      row.update(question="", label=str(int(any(v == "p0" and u != "p0" for u, v in links))))
    else:
      k = rng.randrange(len(texts))
      words = texts[k].split()
      j = rng.randrange(len(words) - 1)
      start = texts[k].index(words[j + 1], len(" ".join(words[:j + 1])))
      row.update(question=f"Which word follows {words[j]}?", answer=dict(passage=ids[k], text=words[j + 1], start=start))
    rows.append(json.dumps(row))
  return rows
