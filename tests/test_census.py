"""bertjax.train.census: every dot of a compiled train step is read and put in a known library (a change in
how XLA marks its libraries fails here), each library's marking is recognized, model.dense_grad=transposed
moves the dense weight gradients off Eigen, and runtime.cpu_flags yields to the user's XLA_FLAGS."""

import re

import jax
import pytest

from bertjax.core import runtime
from bertjax.train import bench, census
from conftest import micro

# One micro train step per model.dense_grad (transposed: slow tier), compiled once for the module (about 2 s
# each at the suite's optimization level), under the routing runtime.setup() gives the suite (conftest).
@pytest.fixture(scope="module", params=["xla", pytest.param("transposed", marks=pytest.mark.slow)])
def step_hlo(request):
  config = micro("configs/bert.py:tiny")
  config.model.update(hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1, dense_grad=request.param)
  config.seq_len, config.batch_size = 32, 4
  b = bench.setup(config)
  compiled, _ = bench.compile_step(b)
  return compiled.as_text(), b


def test_census_puts_every_dot_of_a_train_step_in_a_known_library(step_hlo):
  text, b = step_hlo
  c = census.census(text)
  # Counted apart from the parser: every dot instruction and oneDNN matmul call in the text is in the census.
  raw = len(re.findall(r"= \S+ dot\(", text)) + text.count(f'custom_call_target="{census.ONEDNN_MATMUL}"')
  assert c["dots"] == raw > 0
  rows = c["libraries"]
  assert "unknown" not in rows, [d for d in c["slow_path"] if d["library"] == "unknown"]
  assert sum(r["dots"] for r in rows.values()) == raw
  assert set(rows) <= set(census.LIBRARIES)
  # The dots' FLOPs are the model's matmuls: forward, and two gradients each (the analytic count also holds
  # the few elementwise FLOPs the census leaves out).
  step_flops = b.flops_per_token * b.batch_size * b.seq_len
  assert 0.9 * step_flops < c["total_gflops"] * 1e9 <= 1.01 * step_flops


def test_transposed_dense_grads_leave_eigen_only_attention_and_the_tied_decoder(step_hlo):
  """XLA:CPU's YNNPACK rejects a weight gradient's transposed left operand, so with dense_grad=xla the dense
  layers' gradients run on Eigen; dense_grad=transposed hands it x^T and YNNPACK takes them."""
  text, b = step_hlo
  eigen = [d for d in census.parse(text) if d.library == "eigen"]
  dense = [d for d in eigen if "lhs_batch_dims" not in d.dims and "attend" not in d.op_name]
  assert jax.default_backend() == "cpu"
  if b.steps.model.cfg.dense_grad == "transposed":
    assert not dense, [(d.op_name, d.dims) for d in dense]
  else:  # if a later jaxlib's YNNPACK takes them, the switch (and docs/cpu.md) have lost their reason
    assert dense and all("lhs_contracting_dims={0}" in d.why for d in dense)


_HLO = """
%fused_ynn (p0: f32[8,4], p1: f32[4,2]) -> f32[8,2] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[4,2]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%fused_other (p0: f32[8,4], p1: f32[4,2]) -> f32[8,2] {
  %p0.2 = f32[8,4]{1,0} parameter(0)
  %p1.2 = f32[4,2]{1,0} parameter(1)
  ROOT %dot.2 = f32[8,2]{1,0} dot(%p0.2, %p1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%body (t: (f32[8,4], f32[8,2])) -> (f32[8,4], f32[8,2]) {
  %t = (f32[8,4]{1,0}, f32[8,2]{1,0}) parameter(0)
  %a = f32[8,4]{1,0} get-tuple-element(%t), index=0
  %g = f32[8,2]{1,0} get-tuple-element(%t), index=1
  %dot.3 = f32[4,2]{1,0} dot(%a, %g), lhs_contracting_dims={0}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/transpose(jvp(f))/dense/transpose"}
  ROOT %r = (f32[8,4]{1,0}, f32[8,2]{1,0}) tuple(%a, %g)
}
ENTRY %main (a: f32[8,4], b: f32[4,2], v: f32[4]) -> f32[8,2] {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[4,2]{1,0} parameter(1)
  %v = f32[4]{0} parameter(2)
  %y = f32[8,2]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_ynn, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %o = f32[8,2]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_other, backend_config={"fusion_config":{"kind":"__onednn_fusion"}}
  %mv = f32[8]{0} dot(%a, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %cc = f32[8,2]{1,0} custom-call(%a, %b), custom_call_target="__onednn$matmul"
  %w = (f32[8,4]{1,0}, f32[8,2]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  ROOT %r = f32[8,2]{1,0} add(%y, %o)
}
"""


def test_census_reads_each_library_marking():
  dots = {d.name: d for d in census.parse(_HLO)}
  assert {n: d.library for n, d in dots.items()} == {
      "dot.1": "ynnpack", "dot.2": "onednn", "dot.3": "eigen", "mv": "xla", "cc": "onednn"}
  assert dots["dot.1"].flops == 2 * 8 * 2 * 4 and dots["cc"].flops == 2 * 8 * 2 * 4
  assert dots["dot.3"].executions == 12 and dots["dot.3"].flops == 2 * 4 * 2 * 8  # once per loop iteration
  assert "weight gradient" in dots["dot.3"].why and "lhs_contracting_dims={0}" in dots["dot.3"].why
  rows = census.summarize(list(dots.values()))
  assert rows["eigen"]["executions"] == 12 and rows["onednn"]["dots"] == 2
  # A fusion kind the census does not know is "unknown", which the train-step test above rejects.
  unknown = _HLO.replace("__onednn_fusion", "__new_library_fusion")
  assert {d.name: d.library for d in census.parse(unknown)}["dot.2"] == "unknown"


def test_cpu_flags_default_yields_to_the_users_xla_flags(monkeypatch):
  import os

  monkeypatch.setattr(runtime, "CPU_XLA_FLAGS", (("--xla_cpu_use_onednn", "true"), ("--xla_cpu_prefer_vector_width", "512")))
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_onednn=false --xla_backend_optimization_level=0")
  monkeypatch.delenv(runtime.CPU_FLAGS_ENV, raising=False)
  assert runtime.cpu_flags() == ["--xla_cpu_prefer_vector_width=512"]
  flags = os.environ["XLA_FLAGS"].split()
  assert "--xla_cpu_use_onednn=false" in flags and "--xla_cpu_use_onednn=true" not in flags  # the user's wins
  assert "--xla_cpu_prefer_vector_width=512" in flags
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv(runtime.CPU_FLAGS_ENV, "off")
  assert runtime.cpu_flags() == [] and os.environ["XLA_FLAGS"] == ""
