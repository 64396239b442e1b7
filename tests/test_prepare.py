"""Preparation into shards and training from them: formats, streaming chunks, determinism, checks, the CLI."""

import dataclasses
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data import cache_entry, instances, pipeline, prepare_lib, shards, sources
from bertjax.data.tokenizer import SpecialIds
from bertjax.train import loop
from conftest import MICRO_FLAGS, REPO, micro

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
CONFIGS = ("configs/bert.py:tiny", "configs/albert.py:tiny", "configs/electra.py:tiny", "configs/roberta.py:tiny")


# ------------------------------------------------------------------ instance formats (no files)

def _docs(n_docs=30, seed=0):
  """Documents of sentences whose token ids are unique and increasing through the corpus."""
  rng, docs, next_id = np.random.default_rng(seed), [], 100
  for _ in range(n_docs):
    doc = []
    for _ in range(rng.integers(1, 6)):
      n = int(rng.integers(3, 25))
      doc.append((np.arange(next_id, next_id + n, dtype=np.int32), np.ones(n, bool)))
      next_id += n
    docs.append(doc)
  return docs


def test_full_sentences_pack_whole_sentences_across_documents_with_a_separator():
  docs = _docs()
  arrays, stats = instances.make_instances(docs, "full_sentences", 64, SPECIAL, dupe_factor=5)
  doc_of = {int(t): d for d, doc in enumerate(docs) for s in doc for t in s[0]}
  starts = {int(doc[0][0][0]) for doc in docs}
  stream, crossing = [], 0
  for ids in arrays["input_ids"]:
    real = ids[ids != SPECIAL.pad]
    assert real[0] == SPECIAL.cls and real[-1] == SPECIAL.sep and len(real) <= 64
    body = real[1:-1]
    seps = np.flatnonzero(body == SPECIAL.sep)
    # A separator stands exactly before the first token of a new document, never at the row's edge.
    assert all(0 < i < len(body) - 1 and int(body[i + 1]) in starts for i in seps)
    tokens = body[body != SPECIAL.sep]
    crossing += len({doc_of[int(t)] for t in tokens}) > 1
    stream.extend(tokens.tolist())
  assert stream == sorted(doc_of), "the rows do not hold the corpus in order, once (one pass, no dupes)"
  assert crossing > 0 and stats.instances == len(arrays["input_ids"])
  assert (arrays["groups"] == (arrays["input_ids"] != SPECIAL.pad)).all()


def test_packed_rows_keep_examples_apart_with_groups_and_restarted_positions():
  docs = _docs(seed=1)
  arrays, stats = instances.make_instances(docs, "packed", 64, SPECIAL)
  single, _ = instances.make_instances(docs, "single", 64, SPECIAL)
  assert len(arrays["input_ids"]) < len(single["input_ids"]) and stats.examples == len(single["input_ids"])
  seen = []
  for ids, groups, pos in zip(arrays["input_ids"], arrays["groups"], arrays["position_ids"]):
    for g in range(1, groups.max() + 1):
      where = np.flatnonzero(groups == g)
      assert (np.diff(where) == 1).all() and (pos[where] == np.arange(len(where))).all()
      example = ids[where]
      assert example[0] == SPECIAL.cls and example[-1] == SPECIAL.sep
      seen.append(tuple(example[1:-1]))
    assert (ids[groups == 0] == SPECIAL.pad).all()
  single_examples = [tuple(r[(r != SPECIAL.pad)][1:-1]) for r in single["input_ids"]]
  assert sorted(seen) == sorted(single_examples)


# ------------------------------------------------------------------ streaming pieces

def _split(docs, eval_fraction):
  """The documents kept for training and those held out: a fixed draw per document (seed 1234), in order."""
  rng = random.Random(1234)
  held = [rng.random() < eval_fraction for _ in docs]
  return [d for d, h in zip(docs, held) if not h], [d for d, h in zip(docs, held) if h]


def test_chunks_hold_two_documents_and_hold_out_a_fixed_choice_of_documents():
  docs = [[f"doc {i} " + "x" * (i % 7 * 40)] for i in range(101)]
  chunks = list(prepare_lib.chunk_documents(iter(docs), 0.2, chunk_bytes=300))
  train, held = _split(docs, 0.2)
  for split, expected in (("train", train), ("eval", held)):
    mine = [c for c in chunks if c[0] == split]
    assert [c[1] for c in mine] == list(range(len(mine)))
    assert all(len(c[2]) >= 2 for c in mine) and len(mine) > 2
    assert [d for c in mine for d in c[2]] == expected


def test_ordered_map_keeps_order_and_never_reads_far_ahead():
  consumed = []

  def tasks():
    for i in range(40):
      consumed.append(i)
      yield -i

  out = []
  for result in prepare_lib.ordered_map(abs, tasks(), workers=2, max_in_flight=3):
    assert len(consumed) - len(out) <= 3, "the reader ran ahead of the workers"
    out.append(result)
  assert out == list(range(40))


# ------------------------------------------------------------------ preparation on a multi-file text corpus

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The demo corpus written as three text files, one paragraph (three sentences) a line."""
  root = tmp_path_factory.mktemp("corpus")
  docs = list(sources.documents("demo", sources.SourceStats()))
  for f in range(3):
    with open(root / f"part-{f}.txt", "w") as out:
      for doc in docs[f::3]:
        out.write("\n".join(" ".join(doc[i:i + 3]) for i in range(0, len(doc), 3)) + "\n\n")
  return f"text:{root}/part-*.txt", docs


def _config(spec, corpus, **overrides):
  return micro(spec, **{"data.source": corpus[0], "data.split_paragraphs": True, **overrides})


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
  """Shards of the corpus for each config family, prepared in this process."""
  out = {}
  for spec in CONFIGS:
    directory = str(tmp_path_factory.mktemp("shards"))
    prepare_lib.prepare(_config(spec, corpus), directory, workers=0, progress=None)
    out[spec] = directory
  return out


def test_shards_hold_the_counted_rows_and_the_held_out_documents(prepared, corpus):
  directory = prepared["configs/bert.py:tiny"]
  meta = shards.read_metadata(directory)
  _, held = _split(corpus[1], 0.1)
  assert meta["format"] == "nsp" and meta["seq_len"] == 64
  assert meta["splits"]["eval"]["documents"] == len(held)
  assert meta["counts"]["source"]["documents"] == len(corpus[1])
  split = list(sources.documents(corpus[0], sources.SourceStats(), split_paragraphs=True))
  assert meta["counts"]["source"]["sentences"] == sum(len(d) for d in split) > len(split) * 2
  for split in ("train", "eval"):
    rows = shards.open_split(directory, meta, split)
    assert len(rows) == meta["splits"][split]["rows"] == meta["counts"][split]["instances"] > 0
    data = rows.take(np.arange(len(rows)))
    assert int((data["groups"] > 0).sum()) == meta["counts"][split]["tokens"]
    assert (data["input_ids"][:, 0] == 2).all()  # [CLS]: ids 0..4 are the specials
  assert 0.4 < meta["counts"]["train"]["positive"] / meta["counts"]["train"]["instances"] < 0.65
  assert os.path.exists(os.path.join(directory, "tokenizer.model"))


def test_the_train_text_s_token_counts_are_stored_checked_and_counted_alike_from_rows(prepared):
  """prepare stores the train text's token counts (what masking.replace_dist=unigram and masking.smoothing draw
  from); for RoBERTa's rows, which hold the train text once, they equal the loader's fallback count of the rows'
  ids (shards prepared before counts were stored), special ids aside; a changed counts file is refused."""
  directory = prepared["configs/roberta.py:tiny"]
  meta = shards.read_metadata(directory)
  stored = shards.read_token_counts(directory, meta)
  assert stored.sum() == meta["token_counts"]["tokens"] > 1000
  data = pipeline._open_shards(micro("configs/roberta.py:tiny", **{"data.source": f"shards:{directory}"}), directory)
  never = list(data.tokenizer.special.never_masked)
  vocab = len(stored)
  fallback = pipeline.corpus_token_counts(dataclasses.replace(data, token_counts=None), vocab)
  kept = pipeline.corpus_token_counts(data, vocab)
  kept[never] = 0
  np.testing.assert_array_equal(kept, fallback)
  np.save(os.path.join(directory, shards.TOKEN_COUNTS), stored + 1)
  try:
    with pytest.raises(UserError, match="not the token counts metadata.json records"):
      shards.read_token_counts(directory, meta)
  finally:
    np.save(os.path.join(directory, shards.TOKEN_COUNTS), stored)


def test_electra_shards_count_their_one_segment_rows_and_eval_has_no_short_targets(prepared):
  directory = prepared["configs/electra.py:tiny"]
  meta = shards.read_metadata(directory)
  assert meta["format"] == "electra"
  for split in ("train", "eval"):
    rows = shards.open_split(directory, meta, split)
    pair = (rows.take(np.arange(len(rows)))["type_ids"] == 1).any(1)
    counts = meta["counts"][split]
    assert (~pair).sum() == counts["one_segment"] >= counts["one_segment_drawn"] and pair.sum() > 0
  assert meta["counts"]["eval"]["short_targets"] == 0 < meta["counts"]["train"]["short_targets"]


@pytest.mark.parametrize("spec", CONFIGS)
def test_a_corpus_and_shards_prepared_from_it_give_the_same_batches(prepared, corpus, spec):
  """One road: naming the text corpus prepares it into the cache with prepare's code, so (seed, step)
  gives the same batch as `prepare` + shards:DIR of the same files."""
  from_shards = pipeline.build(micro(spec, **{"data.source": f"shards:{prepared[spec]}"}))
  from_text = pipeline.build(_config(spec, corpus))
  assert isinstance(from_text.train, shards.Rows) and isinstance(from_text.eval, shards.Rows)
  assert from_text.train.directory.startswith(pipeline.cache_dir(_config(spec, corpus)))
  assert from_text.tokenizer.fingerprint == from_shards.tokenizer.fingerprint
  assert from_text.stats == from_shards.stats
  for step in (0, 3, 1000):
    a = pipeline.batch_at(from_shards.train, step, 8, seed=0)
    b = pipeline.batch_at(from_text.train, step, 8, seed=0)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), f"step {step} differs"
  a, b = (list(pipeline.eval_batches(d.eval, 8))[-1] for d in (from_shards, from_text))
  np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
  halves = [pipeline.batch_at(from_shards.train, 3, 8, 0, process_index=p, process_count=2) for p in (0, 1)]
  np.testing.assert_array_equal(np.concatenate([h["input_ids"] for h in halves]),
                                pipeline.batch_at(from_shards.train, 3, 8, 0)["input_ids"])


def test_a_config_with_phases_is_prepared_per_seq_len_and_served_phase_by_phase(corpus, tmp_path):
  """prepare writes OUT/seq_len_N per phase seq_len with one tokenizer; shards:OUT gives each phase the
  batches that naming the corpus gives it."""
  from bertjax.core import config as config_lib

  spec, out = "configs/bert.py:tiny_two_phase", tmp_path / "phased"
  overrides = {"data.source": corpus[0], "data.split_paragraphs": True}
  cmd = [sys.executable, "-m", "bertjax.data.prepare", f"--config={spec}", f"--out={out}", "--workers=0",
         *(f"--config.{k}={v}" for k, v in overrides.items()), *MICRO_FLAGS]
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert sorted(os.listdir(out)) == ["seq_len_128", "seq_len_64"]
  fingerprints = set()
  for phase in config_lib.phases(micro(spec, **overrides)):
    from_text = pipeline.build(phase.config)
    shards_config = phase.config.copy_and_resolve_references()
    shards_config.data.source = f"shards:{out}"
    from_shards = pipeline.build(shards_config)
    assert from_shards.train.directory == str(out / f"seq_len_{phase.config.seq_len}")
    fingerprints |= {from_text.tokenizer.fingerprint, from_shards.tokenizer.fingerprint}
    a, b = (pipeline.batch_at(d.train, 5, 8, seed=0) for d in (from_shards, from_text))
    assert a["input_ids"].shape == (8, phase.config.seq_len)
    assert all(np.array_equal(a[k], b[k]) for k in a)
  assert len(fingerprints) == 1


def test_the_cache_is_reused_and_keyed_by_every_setting_that_changes_the_rows(corpus, tmp_path, monkeypatch):
  base = _config("configs/electra.py:tiny", corpus, **{"data.cache_dir": str(tmp_path)})
  first = pipeline.build(base)
  made = []
  real = prepare_lib.prepare
  monkeypatch.setattr(prepare_lib, "prepare", lambda *a, **k: made.append(1) or real(*a, **k))
  again = pipeline.build(base)
  assert not made and again.train.directory == first.train.directory
  longer = pipeline.build(_config("configs/electra.py:tiny", corpus,
                                  **{"data.cache_dir": str(tmp_path), "seq_len": 96}))
  assert made == [1] and longer.train.directory != first.train.directory
  assert len(pipeline.batch_at(longer.train, 0, 4, 0)["input_ids"][0]) == 96
  entries = sorted(e for e in os.listdir(tmp_path) if e != "verified")  # verified: shards.verify's records
  assert [e.split("-")[0] for e in entries] == ["shards", "shards", "tokenizer"], entries  # one tokenizer, no leftovers
  source = sources.fingerprint(base.data.source)
  key = pipeline.shards_key(base, source, first.tokenizer.fingerprint)
  for override in ({"seed": 1}, {"seq_len": 32}, {"data.dupe_factor": 2}, {"data.short_seq_prob": 0.2},
                   {"data.eval_fraction": 0.2}, {"data.split_paragraphs": False}, {"data.format": "packed"},
                   {"data.format": "single"}, {"objectives.sop": 1.0, "data.format": "auto"}):
    changed = _config("configs/electra.py:tiny", corpus, **override)
    assert pipeline.shards_key(changed, source, first.tokenizer.fingerprint) != key, override
  assert pipeline.shards_key(base, source, "another tokenizer") != key
  monkeypatch.setattr(prepare_lib, "ROWS_VERSION", prepare_lib.ROWS_VERSION + 1)  # other row-building code
  assert pipeline.shards_key(base, source, first.tokenizer.fingerprint) != key
  monkeypatch.undo()
  tok_key = pipeline.tokenizer_key(base, source)
  for override in ({"seed": 1}, {"model.vocab_size": 999}, {"data.tokenizer_model": "bpe"},
                   {"data.tokenizer_sentences": 10}, {"data.eval_fraction": 0.2}):
    assert pipeline.tokenizer_key(_config("configs/electra.py:tiny", corpus, **override), source) != tok_key, override
  assert pipeline.tokenizer_key(_config("configs/electra.py:tiny", corpus, seq_len=32), source) == tok_key


def test_cache_entries_appear_whole_or_not_at_all(tmp_path):
  final = str(tmp_path / "shards-k")

  def crash(tmp):
    open(os.path.join(tmp, "train-00000.rows"), "w").close()
    raise RuntimeError("killed")

  with pytest.raises(RuntimeError):
    cache_entry.once(final, crash)
  assert os.listdir(tmp_path) == []

  def lose_the_race(tmp):  # another process renames its copy into place while this one prepares
    os.makedirs(final)
    open(os.path.join(final, "winner"), "w").close()
    open(os.path.join(tmp, "loser"), "w").close()

  assert cache_entry.once(final, lose_the_race) == final
  assert os.listdir(tmp_path) == ["shards-k"] and os.listdir(final) == ["winner"]


def test_workers_code_computes_without_jax(prepared, corpus):
  """prepare's workers import prepare_lib and tokenize: none of that may import JAX (or TensorFlow)."""
  directory = prepared["configs/albert.py:tiny"]
  meta = shards.read_metadata(directory)
  script = f"""
import os, sys
sys.path.insert(0, {REPO!r})
import numpy as np
from bertjax.data import pipeline, prepare_lib, shards, sources
docs = list(sources.documents({corpus[0]!r}, sources.SourceStats()))[:6]
dtype = shards.row_dtype({meta["fields"]!r}, 64)
tokenizer = "spm:" + os.path.join({directory!r}, "tokenizer.model")
settings = prepare_lib.Settings(tokenizer, True, "sop", 64, 0.1, 1, 0, dtype)
result = prepare_lib.process_chunk((settings, "train", 0, docs))
print(len(result.records), "jax" in sys.modules, "tensorflow" in sys.modules)
"""
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  rows, jax, tf = done.stdout.split()
  assert int(rows) > 0 and (jax, tf) == ("False", "False")


@pytest.mark.parametrize("override,message", [
    ({"seq_len": 128}, "seq_len 64"),
    ({"objectives.nsp": 0.0, "objectives.sop": 1.0}, "hold nsp instances"),
    ({"model.vocab_size": None}, "vocab_size"),  # None: one more than the shards' tokenizer has
])
def test_training_refuses_shards_made_for_another_config(prepared, override, message):
  directory = prepared["configs/bert.py:tiny"]
  if override.get("model.vocab_size", 0) is None:
    override = {"model.vocab_size": shards.read_metadata(directory)["tokenizer"]["vocab_size"] + 1}
  config = micro("configs/bert.py:tiny", **{"data.source": f"shards:{directory}", **override})
  with pytest.raises(UserError, match=message):
    pipeline.build(config)


def test_training_refuses_another_tokenizer_and_unfinished_shards(prepared, tmp_path):
  other = prepared["configs/roberta.py:tiny"]  # BPE: another vocabulary
  config = micro("configs/bert.py:tiny", **{"data.source": f"shards:{prepared['configs/bert.py:tiny']}",
                                            "data.tokenizer": f"spm:{other}/tokenizer.model"})
  with pytest.raises(UserError, match="not the tokenizer the shards"):
    pipeline.build(config)
  with pytest.raises(UserError, match="not a finished preparation"):
    pipeline.build(micro("configs/bert.py:tiny", **{"data.source": f"shards:{tmp_path}"}))


def test_shards_do_not_depend_on_the_number_of_workers(corpus, tmp_path, monkeypatch):
  monkeypatch.setattr(prepare_lib, "CHUNK_BYTES", 40_000)  # several chunks per split
  config = _config("configs/albert.py:tiny", corpus, **{"data.tokenizer": ""})
  metas = [prepare_lib.prepare(config, str(tmp_path / str(w)), workers=w, progress=None) for w in (0, 2)]
  assert metas[0]["counts"] == metas[1]["counts"]
  for split in ("train", "eval"):
    files = [tmp_path / str(w) / s["file"] for w in (0, 2) for s in metas[0]["splits"][split]["shards"]]
    assert files[0].read_bytes() == files[1].read_bytes()


@pytest.mark.slow  # 24 s cold: a training run; the shards themselves are checked in the normal tier
def test_roberta_trains_from_packed_shards(corpus, tmp_path):
  config = _config("configs/roberta.py:tiny", corpus, **{"data.format": "packed"})
  prepare_lib.prepare(config, str(tmp_path / "shards"), workers=0, progress=None)
  config = micro("configs/roberta.py:tiny", **{
      "data.source": f"shards:{tmp_path / 'shards'}", "data.format": "packed", "total_steps": 4,
      "warmup_steps": 1, "log_every": 2, "eval_every": 4, "checkpoint_every": 4})
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert np.isfinite(records[-1]["eval/mlm_loss"]) and records[-1]["step"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("spec", CONFIGS)
def test_each_family_trains_from_prepared_shards(prepared, spec, tmp_path):
  config = micro(spec, **{"data.source": f"shards:{prepared[spec]}", "total_steps": 20, "warmup_steps": 2,
                          "log_every": 10, "eval_every": 20, "checkpoint_every": 20})
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  train = [r for r in records if "train/loss" in r]
  assert train[-1]["train/loss"] < train[0]["train/loss"]


SMALL_VOCAB = {"model.vocab_size": 1000}  # 60 documents support fewer pieces than the tiny configs use


def _articles(n=60):
  """Demo documents as tfds wikipedia examples: an article's paragraphs separated by newlines."""
  docs = list(sources.documents("demo", sources.SourceStats()))[:n]
  return ["\n".join(" ".join(d[i:i + 3]) for i in range(0, len(d), 3)) for d in docs]


def test_prepare_reads_a_tfds_dataset_without_tensorflow(tmp_path):
  from test_sources import tiny_tfds

  articles = _articles()
  source = tiny_tfds(tmp_path / "tfds", articles)
  config = micro("configs/electra.py:tiny", **{"data.source": source, "data.tfds_data_dir": str(tmp_path / "tfds"),
                                               **SMALL_VOCAB})
  directory = str(tmp_path / "shards")
  prepare_lib.prepare(config, directory, workers=0, progress=None)
  meta = shards.read_metadata(directory)
  assert meta["source"] == source and meta["counts"]["source"]["documents"] == len(articles)
  assert meta["settings"]["split_paragraphs"] and meta["splits"]["eval"]["rows"] > 0
  data = pipeline.build(micro("configs/electra.py:tiny", **{"data.source": f"shards:{directory}", **SMALL_VOCAB}))
  assert len(data.train) == meta["splits"]["train"]["rows"] > 0
  assert "tensorflow" not in sys.modules


def test_cli_prints_the_summary_and_refuses_to_overwrite(corpus, tmp_path):
  cmd = [sys.executable, "-m", "bertjax.data.prepare", "--config=configs/electra.py:tiny", "--workers=0",
         f"--config.data.source={corpus[0]}", "--config.data.split_paragraphs=True", "--config.seq_len=64",
         f"--out={tmp_path}"]
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "electra rows of seq_len 64" in done.stdout and "tokens/s" in done.stdout
  assert "one-segment share" in done.stdout
  assert "documents too short for a pair" in done.stdout
  again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert again.returncode == 2 and again.stderr.startswith("error: ") and "--overwrite" in again.stderr


# --- one preparer per cache entry ------------------------------------------------------------------------

_PREPARE_SCRIPT = """
import os, sys, time
sys.path.insert(0, {repo!r})
from bertjax.core import config as config_lib
from bertjax.data import pipeline, prepare_lib
index, root = int(sys.argv[1]), {root!r}
c = config_lib.load(os.path.join({repo!r}, "configs/bert.py:tiny"))
c.data.source, c.data.tokenizer, c.data.cache_dir = "text:" + os.path.join(root, "corpus.txt"), "wordpiece:" + os.path.join(root, "vocab.txt"), os.path.join(root, "cache")
c.model.vocab_size, c.seq_len, c.data.dupe_factor = {vocab_size}, 64, 1
make = prepare_lib.prepare
def slow_prepare(*args, **kwargs):  # long enough that the others are still waiting
  time.sleep(1)
  return make(*args, **kwargs)
prepare_lib.prepare = slow_prepare
open(os.path.join(root, f"ready-{{index}}"), "w").close()
while not all(os.path.exists(os.path.join(root, f"ready-{{i}}")) for i in range(3)):  # start together
  time.sleep(0.05)
print(pipeline.prepared(c, process_index=index))
"""


def test_one_process_prepares_a_cache_entry_and_the_others_wait_for_it(tmp_path):
  """Three processes of one run (process_index 0, 1, 2) ask for the same cache entry at once: process 0
  prepares it (the only "data: preparing" line), 1 and 2 wait for it, and all three get the same entry."""
  words = "the cat sat on a mat and then it ran home dog was big bird small".split()
  rng = np.random.default_rng(0)
  (tmp_path / "corpus.txt").write_text("\n\n".join(
      "\n".join(" ".join(rng.choice(words, 8)) + "." for _ in range(4)) for _ in range(20)) + "\n")
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  script = _PREPARE_SCRIPT.format(repo=REPO, root=str(tmp_path), vocab_size=len(vocab))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env) for i in range(3)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
  entries = {out.strip() for out, _ in outs}
  assert len(entries) == 1 and os.path.isfile(os.path.join(entries.pop(), shards.METADATA))
  preparing = [i for i, (_, err) in enumerate(outs) for line in err.splitlines() if line.startswith("data: preparing")]
  assert preparing == [0], [err for _, err in outs]
  assert all("waits for process 0" in err for _, err in outs[1:]), [err for _, err in outs]
  left = os.listdir(tmp_path / "cache")
  assert len(left) == 1 and left[0].startswith("shards-") and "." not in left[0]  # no claim or temporary left


def test_waiting_for_another_process_s_entry_times_out_with_one_line(tmp_path):
  """A process that waits longer than data.prepare_wait_s says so in one line naming the preparer (process 0,
  its host and pid), the entry and the fixes."""
  import json
  import socket

  final = str(tmp_path / "shards-k")
  with open(final + ".claim", "w") as f:  # process 0, alive (this test's own pid), preparing
    json.dump(dict(process=0, host=socket.gethostname(), pid=os.getpid()), f)
  made = []
  with pytest.raises(UserError) as e:
    cache_entry.once(final, made.append, process_index=2, wait_s=0.3, head_start_s=0.1)
  message = str(e.value)
  assert "\n" not in message and not made
  assert f"process 2 waited 0s for process 0 (host {socket.gethostname()}, pid {os.getpid()}) to prepare the " \
         f"data cache entry {final}" in message
  assert "--config.data.prepare_wait_s" in message and "shards:DIR" in message
  # Before process 0 has claimed the entry, the wait names process 0 too.
  with pytest.raises(UserError, match=r"process 1 waited 0s for process 0 to prepare the data cache entry"):
    cache_entry.once(str(tmp_path / "shards-j"), made.append, process_index=1, wait_s=0.3, head_start_s=60)


def test_an_abandoned_claim_is_taken_over(tmp_path):
  """A claim whose preparer is gone (killed: a pid of this host that no longer runs) does not block the entry."""
  import json
  import socket

  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  final = str(tmp_path / "shards-k")
  with open(final + ".claim", "w") as f:
    json.dump(dict(process=0, host=socket.gethostname(), pid=int(gone.stdout)), f)
  assert cache_entry.once(final, lambda tmp: open(os.path.join(tmp, "rows"), "w").close(), wait_s=5) == final
  assert sorted(os.listdir(tmp_path)) == ["shards-k"] and os.listdir(final) == ["rows"]
