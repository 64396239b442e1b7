"""Data pipeline benchmark: preparation throughput and memory, loader throughput against the train step.

  python benchmarks/data_pipeline.py                                   # the demo corpus written out, 16 MB
  python benchmarks/data_pipeline.py --corpus='../shared/data/pretrain/wiki-00.txt' --json=/tmp/data.json

What it measures, on this machine:
1. Preparation (`python -m bertjax.data.prepare`, a separate process each, as a user runs it) of a text corpus
   (one paragraph a line, split into sentences) for `--config`, with the tokenizer trained once
   beforehand so the runs time the instance pass alone: tokens/s with 1 and with 2 worker processes
   (per worker, and the 1 -> 2 scaling), and the corpus 4x over (the same files linked four times)
   with 2 workers. Peak memory is the summed resident memory of the run's processes (main + workers),
   sampled every 20 ms: it must not grow with the corpus. CPU seconds (the run's processes, user +
   system, start-up and tokenizer loading included) give tokens per CPU second, which a busy machine
   changes far less than tokens per wall second: scaling is only visible where the cores are free.
   The 1x corpus must span many chunks (prepare_lib.CHUNK_BYTES, 1 MiB; 2 x workers are in flight)
   for 1x and 4x to be comparable: the default 16 MB does.
2. The loader: tokens/s that `pipeline.batch_at` delivers from the memory-mapped shards at the config's
   batch size (host arrays, and moved to the device), against the tokens/s the config's train step
   consumes (`bertjax.train.bench.measure`), and the loader's resident-memory growth.

  python benchmarks/data_pipeline.py --compare --mb=4 --steps=200  # our shards and loader vs ArrayRecord and grain

  python benchmarks/data_pipeline.py --hosts=4 [--shards=DIR] --steps=300   # per-host reads on a pod

3. `--hosts=N` (alone): the read rate of each of N hosts taking its share of every global batch
   (`pipeline.batch_at` with process_index p of N: batch_size / N rows a step, a fresh memory map per host),
   rows/s, tokens/s and MB/s of rows, the shard files each host opened, against one host reading whole
   batches. Over `--shards=DIR` (prepared by `python -m bertjax.data.prepare`), else the config's own data.
4. `--compare` (alone): the same prepared train rows (batch 256, seq 128) read side by side in one run:
   random-access batch reads of our .rows shard (memmap) vs the same rows as ArrayRecord records
   (group_size 1, uncompressed: the random-access setting), and our loader (`pipeline.batch_at`, a per-(seed, epoch)
   permutation computed per index) vs a grain MapDataset with a per-epoch shuffle over the same rows
   (`source(...).shuffle(seed).repeat().batch(256)`, indexed by step: grain's stateless random access).
   Needs `pip install grain array-record`; neither is a bertjax dependency.
"""

import argparse
import collections
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _rss(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def tree_rss(pid: int) -> int:
  """Resident bytes of `pid` and all its descendants (Linux /proc)."""
  children = collections.defaultdict(list)
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(entry))
      except (OSError, IndexError, ValueError):
        continue
  total, stack = 0, [pid]
  while stack:
    p = stack.pop()
    total += _rss(p)
    stack.extend(children[p])
  return total


def run_prepare(config: str, source_glob: str, out: str, workers: int, tokenizer: str = "",
                extra=()) -> dict:
  """Runs the prepare CLI; returns its metadata's timing and counts with the peak memory of its processes."""
  cmd = [sys.executable, "-m", "bertjax.data.prepare", f"--config={config}", f"--config.data.source=text:{source_glob}",
         "--config.data.split_paragraphs=True", f"--out={out}", f"--workers={workers}", "--overwrite", *extra]
  if tokenizer:
    cmd.append(f"--config.data.tokenizer={tokenizer}")
  before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the CLI and its workers, once waited for
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  peak = [0]

  def sample():
    while proc.poll() is None:
      peak[0] = max(peak[0], tree_rss(proc.pid))
      time.sleep(0.02)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  stdout, stderr = proc.communicate()
  sampler.join()
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
  if proc.returncode:
    raise SystemExit(f"prepare failed ({proc.returncode}):\n{stderr[-3000:]}")
  with open(os.path.join(out, "metadata.json")) as f:
    meta = json.load(f)
  t = meta["timing"]
  return dict(workers=workers, tokens=meta["counts"]["tokens"], documents=meta["counts"]["source"]["documents"],
              rows=meta["splits"]["train"]["rows"] + meta["splits"]["eval"]["rows"], seconds=t["seconds"],
              tokens_per_sec=t["tokens_per_second"], tokens_per_sec_per_worker=t["tokens_per_second"] / workers,
              tokenizer_seconds=t["tokenizer_seconds"],
              peak_rss_bytes=peak[0], cpu_seconds=cpu, tokens_per_cpu_second=meta["counts"]["tokens"] / cpu,
              summary=stdout.strip())


def demo_corpus(directory: str, megabytes: float) -> str:
  """The demo corpus as paragraph-per-line text, repeated to `megabytes` over four files; returns a glob."""
  from bertjax.data import sources

  docs = list(sources.documents("demo", sources.SourceStats()))
  text = "".join("\n".join(" ".join(d[i:i + 4]) for i in range(0, len(d), 4)) + "\n\n" for d in docs)
  copies = max(1, int(megabytes * 1e6 / len(text.encode()) + 0.5))
  for part in range(4):
    with open(os.path.join(directory, f"demo-{part}.txt"), "w") as f:
      for _ in range(part, copies, 4):
        f.write(text)
  return os.path.join(directory, "demo-*.txt")


def times_four(source_glob: str, directory: str) -> str:
  """A glob naming every file of `source_glob` four times (symbolic links): the same corpus 4x over."""
  for path in sorted(glob.glob(source_glob)):
    for k in range(4):
      os.symlink(os.path.abspath(path), os.path.join(directory, f"copy{k}-{os.path.basename(path)}"))
  return os.path.join(directory, "copy*")


def loader_throughput(config_spec: str, shards_dir: str, steps: int) -> dict:
  """Tokens/s of pipeline.batch_at on the shards (host, and with the device transfer), its memory growth."""
  import jax
  from bertjax.core import config as config_lib
  from bertjax.data import pipeline

  config = config_lib.load(os.path.join(REPO, config_spec))
  config.data.source = f"shards:{shards_dir}"
  data = pipeline.build(config)
  b, s = config.batch_size, config.seq_len
  rss0 = _rss(os.getpid())
  t0 = time.perf_counter()
  for step in range(steps):
    pipeline.batch_at(data.train, step, b, config.seed)
  host = steps * b * s / (time.perf_counter() - t0)
  growth = _rss(os.getpid()) - rss0  # before JAX's own allocations for the device transfer below
  t0 = time.perf_counter()
  for step in range(steps, 2 * steps):
    jax.block_until_ready(jax.device_put(pipeline.batch_at(data.train, step, b, config.seed)))
  device = steps * b * s / (time.perf_counter() - t0)
  return dict(batch_size=b, seq_len=s, rows=len(data.train), loader_tokens_per_sec=host,
              loader_to_device_tokens_per_sec=device, loader_rss_growth_bytes=growth)


def per_host_reads(config_spec: str, hosts: int, steps: int, shards_dir: str = "") -> dict:
  """Each of `hosts` processes' read rate of its share of every global batch (see the docstring, 3.)."""
  from bertjax.core import config as config_lib
  from bertjax.data import pipeline, shards

  config = config_lib.load(os.path.join(REPO, config_spec))
  if shards_dir:
    config.data.source = f"shards:{shards_dir}"
  train = pipeline.build(config).train
  b, s = config.batch_size, config.seq_len
  if b % hosts:
    raise SystemExit(f"error: batch_size {b} is not divisible by --hosts={hosts}")
  results = dict(config=config_spec, source=config.data.source, rows=len(train), shard_files=len(train.shards),
                 batch_size=b, seq_len=s, row_bytes=train.dtype.itemsize, hosts=[])
  for p, n in [(p, hosts) for p in range(hosts)] + [(0, 1)]:
    rows = shards.Rows(train.directory, train.shards, train.dtype)  # this host's own mappings
    per_second = _timed(lambda k: pipeline.batch_at(rows, k, b, config.seed, p, n), steps)  # batches/s
    share = b // n
    results["hosts"].append(dict(process=p, processes=n, rows_per_step=share, rows_per_sec=per_second * share,
                                 tokens_per_sec=per_second * share * s,
                                 mb_per_sec=per_second * share * train.dtype.itemsize / 2**20,
                                 files_opened=len(rows.opened)))
  return results


def _timed(fn, steps: int) -> float:
  """Calls per second of fn(step) over `steps` steps, after one warm-up call; the best of three rounds."""
  fn(0)
  best = 0.0
  for _ in range(3):
    t0 = time.perf_counter()
    for step in range(steps):
      fn(step)
    best = max(best, steps / (time.perf_counter() - t0))
  return best


def compare_grain_arrayrecord(mb: float, steps: int, batch: int = 256, seq_len: int = 128) -> dict:
  """Batches/s of our shards and loader against ArrayRecord and grain over the same rows (see the docstring)."""
  import grain
  import numpy as np
  from array_record.python import array_record_data_source, array_record_module

  from bertjax.core import config as config_lib
  from bertjax.data import pipeline, prepare_lib, shards

  tmp = tempfile.mkdtemp()
  config = config_lib.load(os.path.join(REPO, "configs/bert.py:tiny"))
  config.seq_len, config.data.dupe_factor, config.model.vocab_size = seq_len, 1, 3000
  config.data.source, config.data.split_paragraphs = f"text:{demo_corpus(tmp, mb)}", True
  meta = prepare_lib.prepare(config, os.path.join(tmp, "shards"), workers=2, progress=None)
  rows = shards.open_split(os.path.join(tmp, "shards"), meta, "train")
  n, dtype = len(rows), rows.dtype
  path = os.path.join(tmp, "train.array_record")
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1,uncompressed")
  for record in rows.records(np.arange(n)):
    writer.write(record.tobytes())
  writer.close()
  source = array_record_data_source.ArrayRecordDataSource([path])
  widen = lambda records: {name: shards._widen(name, records[name]) for name in dtype.names}  # noqa: E731
  rng = np.random.default_rng(0)
  random_batches = [rng.integers(0, n, batch) for _ in range(steps)]

  def array_record_read(step):
    raw = source.__getitems__(random_batches[step].tolist())
    return widen(np.frombuffer(b"".join(raw), dtype))

  class MappedRows:  # grain's random-access source protocol over our memory-mapped rows
    def __len__(self):
      return n

    def __getitem__(self, i):
      return rows.records([i])[0]

  def stack(records):
    return widen(np.array(records, dtype))

  grain_shards = grain.MapDataset.source(MappedRows()).shuffle(seed=0).repeat().batch(batch, batch_fn=stack)
  grain_ar = (grain.MapDataset.source(source).map(lambda b: np.frombuffer(b, dtype)[0]).shuffle(seed=0).repeat()
              .batch(batch, batch_fn=stack))
  # Exact resume: batch k is a function of (seed, k) in both loaders.
  assert all(np.array_equal(grain_shards[k]["input_ids"], grain_shards[k]["input_ids"]) for k in (0, 7))
  results = dict(
      rows=n, batch_size=batch, seq_len=seq_len, row_bytes=dtype.itemsize, steps=steps,
      random_read_shards=_timed(lambda k: rows.take(random_batches[k]), steps),
      random_read_array_record=_timed(array_record_read, steps),
      loader_ours=_timed(lambda k: pipeline.batch_at(rows, k, batch, 0), steps),
      loader_grain_over_shards=_timed(lambda k: grain_shards[k], steps),
      loader_grain_over_array_record=_timed(lambda k: grain_ar[k], steps),
      shard_file_bytes=os.path.getsize(os.path.join(tmp, "shards", meta["splits"]["train"]["shards"][0]["file"])),
      array_record_file_bytes=os.path.getsize(path))
  results["ratios"] = dict(
      array_record_over_shards_random_read=results["random_read_array_record"] / results["random_read_shards"],
      grain_over_ours_loader=results["loader_grain_over_shards"] / results["loader_ours"],
      grain_array_record_over_ours_loader=results["loader_grain_over_array_record"] / results["loader_ours"])
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/bert.py:tiny", help="config whose format and seq_len to use")
  parser.add_argument("--corpus", default="", help="glob of paragraph-per-line text files (default: demo text)")
  parser.add_argument("--mb", type=float, default=16.0, help="size of the demo text corpus, when no --corpus")
  parser.add_argument("--steps", type=int, default=300, help="loader steps to time")
  parser.add_argument("--json", default="", help="also write the results here")
  parser.add_argument("--compare", action="store_true", help="only: our shards/loader vs ArrayRecord/grain")
  parser.add_argument("--hosts", type=int, default=0, help="only: each of N hosts' read rate of its batch share")
  parser.add_argument("--shards", default="", help="--hosts: prepared shards to read (default: the config's data)")
  args = parser.parse_args()
  from bertjax.core import runtime

  runtime.setup()  # what every entry point does first: platform, host memory, JAX flags

  if args.hosts:
    results = per_host_reads(args.config, args.hosts, args.steps, args.shards)
    print(f"{results['rows']:,} rows in {results['shard_files']} shard files ({results['source']}), global batch "
          f"{results['batch_size']} x {results['seq_len']}, {results['row_bytes']} bytes a row")
    print(f"{'host':<8} {'rows/step':>9} {'rows/s':>10} {'tokens/s':>12} {'MB/s':>8} {'files opened':>13}")
    for h in results["hosts"]:
      print(f"{h['process']}/{h['processes']:<6} {h['rows_per_step']:>9} {h['rows_per_sec']:>10,.0f} "
            f"{h['tokens_per_sec']:>12,.0f} {h['mb_per_sec']:>8.1f} {h['files_opened']:>13}")
    if args.json:
      with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    return

  if args.compare:
    results = compare_grain_arrayrecord(args.mb, args.steps)
    print(json.dumps(results, indent=2))
    if args.json:
      with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    return

  with tempfile.TemporaryDirectory() as tmp:
    source = args.corpus or demo_corpus(tempfile.mkdtemp(dir=tmp), args.mb)
    big = times_four(source, tempfile.mkdtemp(dir=tmp))
    base = os.path.join(tmp, "tokenizer-run")
    print("training the tokenizer (one prepare run, 2 workers) ...", flush=True)
    first = run_prepare(args.config, source, base, 2, extra=["--config.data.tokenizer_sentences=200000"])
    tokenizer = f"spm:{base}/tokenizer.model"
    runs = {}
    for name, glob_, workers in (("1x_w1", source, 1), ("1x_w2", source, 2), ("4x_w2", big, 2)):
      print(f"prepare {name} ...", flush=True)
      runs[name] = run_prepare(args.config, glob_, os.path.join(tmp, name), workers, tokenizer)
    print("loader and train step ...", flush=True)
    loader = loader_throughput(args.config, os.path.join(tmp, "1x_w2"), args.steps)

  from bertjax.core import config as config_lib
  from bertjax.train import bench

  step = bench.measure(config_lib.load(os.path.join(REPO, args.config)), steps=5, warmup=2)
  results = dict(config=args.config, corpus=args.corpus or f"demo text, {args.mb} MB", cpus=os.cpu_count(),
                 load_average=os.getloadavg(), runs=runs, tokenizer_training_seconds=first["tokenizer_seconds"],
                 **loader,
                 train_step_tokens_per_sec=step["tokens_per_sec"],
                 loader_over_train_step=loader["loader_tokens_per_sec"] / step["tokens_per_sec"],
                 scaling_1_to_2_workers=runs["1x_w2"]["tokens_per_sec"] / runs["1x_w1"]["tokens_per_sec"],
                 peak_memory_4x_over_1x=runs["4x_w2"]["peak_rss_bytes"] / runs["1x_w2"]["peak_rss_bytes"],
                 bench_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
  print(f"\n{runs['1x_w2']['summary']}\n")
  print(f"{'run':<8} {'documents':>10} {'tokens':>12} {'seconds':>8} {'tokens/s':>10} {'per worker':>11} "
        f"{'peak RSS':>9} {'CPU s':>7} {'tokens/CPU s':>13}")
  for name, r in runs.items():
    print(f"{name:<8} {r['documents']:>10,} {r['tokens']:>12,} {r['seconds']:>8.1f} {r['tokens_per_sec']:>10,.0f} "
          f"{r['tokens_per_sec_per_worker']:>11,.0f} {r['peak_rss_bytes'] / 2**20:>7.0f}MB {r['cpu_seconds']:>7.1f} "
          f"{r['tokens_per_cpu_second']:>13,.0f}")
  print(f"scaling 1 -> 2 workers: {results['scaling_1_to_2_workers']:.2f}x on {os.cpu_count()} cores "
        f"(load average {results['load_average'][0]:.1f}); peak memory 4x corpus / 1x: "
        f"{results['peak_memory_4x_over_1x']:.2f}")
  print(f"loader: {loader['loader_tokens_per_sec']:,.0f} tokens/s host, "
        f"{loader['loader_to_device_tokens_per_sec']:,.0f} to device (batch {loader['batch_size']} x "
        f"{loader['seq_len']}), RSS growth {loader['loader_rss_growth_bytes'] / 2**20:.1f} MB; "
        f"train step {step['tokens_per_sec']:,.0f} tokens/s; "
        f"loader / train step = {results['loader_over_train_step']:.0f}x")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
