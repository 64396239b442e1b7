"""benchmarks/inference.py (bertjax's inference paths vs transformers on the CPU) at tiny sizes: every case reports
figures on both sides and outputs that agree, so the two sides did the same work."""

import importlib.util
import os
import re

import pytest
from pydoc_data.topics import topics

from conftest import REPO, tiny_hf_checkpoint


@pytest.mark.slow  # torch, transformers and four bertjax compiles: 75 s on a loaded 2-core machine
def test_inference_benchmark_runs_both_sides_at_equal_work(tmp_path):
  spec = importlib.util.spec_from_file_location("inference_bench", os.path.join(REPO, "benchmarks", "inference.py"))
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  text = [" ".join(s.split()) for s in re.split(r"(?<=\.)\s+", topics["if"] + topics["while"] + topics["for"])]
  text = [s for s in text if 3 < len(s.split()) < 30]
  (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
  words = sorted({w for s in text for w in re.findall(r"\w+|[^\w\s]", s.lower())})
  ckpt = tiny_hf_checkpoint(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])
  out = bench.main([f"--models={ckpt}", f"--text={tmp_path / 'text.txt'}", "--batches=2", "--batch_size=4",
                    "--rounds=1", f"--json={tmp_path / 'out.json'}"])
  rows = {(r["length"], r["task"]): r for r in out["results"]}
  assert set(rows) == {(n, t) for n in ("128", "sst2") for t in ("encode", "classify")}
  for r in rows.values():
    assert r["bertjax_tokens_per_sec"] > 0 and r["transformers_tokens_per_sec"] > 0 and r["bertjax_compile_s"] >= 0
    assert r["max_abs_diff"] < 1e-4, r  # the same model and inputs on both sides
  assert rows["128", "encode"]["real_tokens"] == 8 * 128 and rows["128", "encode"]["bertjax_buckets"] == [128]
  assert rows["sst2", "encode"]["real_tokens"] < 8 * 64 and rows["sst2", "encode"]["bertjax_buckets"][0] < 64
  assert (tmp_path / "out.json").is_file()
