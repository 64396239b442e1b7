"""Which library runs each matmul of a compiled step on the CPU: a dot census read from XLA's optimized HLO.

XLA:CPU (jaxlib 0.10.2) hands a dot to one of several implementations, and the optimized HLO text
(`jax.jit(f).lower(...).compile().as_text()`) says which:
- `ynnpack`: the dot sits in a computation called by a fusion whose backend_config reads
  `"fusion_config":{"kind":"__ynn_fusion"}` (YNNPACK subgraphs; on by default for f32 dots).
- `onednn`: a `__onednn_fusion` fusion (`--xla_cpu_use_onednn=true
  --xla_cpu_experimental_onednn_fusion_type=dot`), or a `__onednn$matmul` custom call (the older route).
- `xnnpack`: a `__xnn_fusion` fusion (`--xla_cpu_experimental_xnn_fusion_type=dot`).
- `eigen`: a dot left on its own, outside any fusion (in the entry computation, a while body or a
  conditional branch). XLA:CPU's thunk emitter runs it as a DotThunk, an Eigen contraction, unless it is a
  matrix-vector product (a non-contracting, non-batch dimension of 1), which it emits as its own tiled GEMV:
- `xla`: XLA's own LLVM code: those matrix-vector products, and dots inside its own loop/output fusions.
- `unknown`: none of the above (a new fusion kind in a later jaxlib): tests/test_census.py rejects it, so a
  change in how XLA marks its libraries shows up as a failing test, not as a silently wrong census.

A dot inside a while loop (the scanned encoder layers) runs once per iteration: `executions` and `flops`
multiply by the loops' `known_trip_count`. FLOPs of a dot are 2 x output elements x contracted size.
"""

import collections
import dataclasses
import math
import re

LIBRARIES = ("ynnpack", "onednn", "xnnpack", "eigen", "xla")
FUSION_KINDS = {"__ynn_fusion": "ynnpack", "__onednn_fusion": "onednn", "__xnn_fusion": "xnnpack"}
ONEDNN_MATMUL = "__onednn$matmul"
_OWN_FUSIONS = ("kLoop", "kOutput", "kInput")  # XLA's own emitted fusions

_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-$]+)\((.*)$")
_SHAPE = re.compile(r"^[a-z]\w*\[([\d,]*)\]")
_CALLS = re.compile(r"\b(calls|body|condition|to_apply|branch_computations|true_computation|false_computation)="
                    r"(\{[^}]*\}|%[\w.\-]+)")


@dataclasses.dataclass
class Dot:
  """One dot of the HLO: where it runs, its work, and what it computes (jax's op name)."""

  name: str
  library: str
  flops: float  # one execution
  executions: int  # per step: the product of the enclosing while loops' trip counts
  op_name: str
  dims: str  # the dot's dimension numbers, as the HLO writes them
  shapes: str  # lhs x rhs -> out

  @property
  def why(self) -> str:
    """A reading of why a dot stayed on Eigen: the operand layout it asks for."""
    if self.library != "eigen":
      return ""
    lhs = re.search(r"lhs_contracting_dims=\{(\d+)\}", self.dims)
    rank = self.shapes.split(" x ")[0].count(",") + 1
    batch = "lhs_batch_dims" in self.dims
    if lhs and int(lhs.group(1)) != rank - 1:
      kind = "batched dot" if batch else "weight gradient (x^T @ dy)" if "transpose" in self.op_name else "dot"
      return f"{kind} with its left operand transposed (lhs_contracting_dims={{{lhs.group(1)}}})"
    return "no library fusion took it"


def _dims(text: str) -> list:
  m = _SHAPE.match(text.strip())
  return [int(d) for d in m.group(1).split(",") if d] if m else []


def _attr(line: str, key: str) -> str:
  m = re.search(rf"{key}=\{{([\d,]*)\}}", line)
  return m.group(1) if m else ""


def parse(hlo_text: str) -> list:
  """Every dot (and oneDNN matmul custom call) of an optimized HLO module, classified; see the module doc."""
  shapes, dots, callers, comp = {}, [], {}, None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header:
      comp = header.group(1)
      continue
    m = _INSTR.match(line)
    if not m or comp is None:
      continue
    name, shape, opcode, rest = m.groups()
    shapes[name] = shape
    for kind, target in _CALLS.findall(line):
      for callee in re.findall(r"%([\w.\-]+)", target):
        callers[callee] = (comp, opcode, line)
    if opcode == "dot" or (opcode == "custom-call" and f'custom_call_target="{ONEDNN_MATMUL}"' in line):
      operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])[:2]
      dots.append((comp, name, shape, opcode, operands, line))
  out = []
  for comp, name, shape, opcode, operands, line in dots:
    out_dims = _dims(shape)
    lhs, rhs = (_dims(shapes.get(o, "")) for o in operands) if len(operands) == 2 else ([], [])
    if opcode == "dot":
      contract = _attr(line, "lhs_contracting_dims")
      k = math.prod(lhs[int(i)] for i in contract.split(",") if i) if lhs and contract else 0
    else:  # a custom call carries no dimension numbers: lhs x rhs = batch * k^2 * out
      batch = math.prod(out_dims[:-2]) if len(out_dims) > 2 else 1
      k = round(math.sqrt(math.prod(lhs) * math.prod(rhs) / max(1, math.prod(out_dims) * batch))) if lhs and rhs else 0
    library, executions = _place(comp, opcode, line, (lhs, rhs), callers)
    op = re.search(r'op_name="([^"]*)"', line)
    dims = " ".join(f"{key}={{{_attr(line, key)}}}" for key in
                    ("lhs_batch_dims", "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims")
                    if _attr(line, key))
    out.append(Dot(name, library, 2.0 * math.prod(out_dims) * k, executions, op.group(1) if op else "", dims,
                   f"{_fmt(lhs)} x {_fmt(rhs)} -> {_fmt(out_dims)}"))
  return out


def _fmt(dims: list) -> str:
  return "[" + ",".join(map(str, dims)) + "]"


def _trip_count(line: str) -> int:
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
  return int(m.group(1)) if m else 1


def _is_matrix_vector(line: str, operands: tuple) -> bool:
  """Whether a dot multiplies by a vector: an operand with no free dimension (other than batch or contracting),
  or a free dimension of 1."""
  for side, dims in zip(("lhs", "rhs"), operands):
    fixed = {int(i) for key in ("batch", "contracting") for i in _attr(line, f"{side}_{key}_dims").split(",") if i}
    free = [d for i, d in enumerate(dims) if i not in fixed]
    if not free or 1 in free:
      return True
  return False


def _place(comp: str, opcode: str, line: str, operands: tuple, callers: dict) -> tuple:
  """(library, executions per step) of a dot in computation `comp`: its nearest enclosing fusion names the
  library; outside any fusion it is a thunk of its own; while loops above it multiply its executions."""
  if opcode == "custom-call":
    library = "onednn"
  else:
    library = None
  executions, seen = 1, set()
  while comp in callers and comp not in seen:
    seen.add(comp)
    comp, caller_op, caller = callers[comp]
    if caller_op == "fusion" and library is None:
      kind = re.search(r'"fusion_config":\{"kind":"([\w$]+)"', caller)
      fusion_kind = re.search(r"kind=(k\w+)", caller)
      if kind and kind.group(1) in FUSION_KINDS:
        library = FUSION_KINDS[kind.group(1)]
      elif fusion_kind and fusion_kind.group(1) in _OWN_FUSIONS:
        library = "xla"
      else:
        library = "unknown"
    elif caller_op == "while":
      executions *= _trip_count(caller)
  if library is None:  # a dot thunk of its own: Eigen, except matrix-vector products
    library = "xla" if _is_matrix_vector(line, operands) else "eigen"
  return library, executions


def summarize(dots: list) -> dict:
  """Per library: dots in the HLO, their executions per step, and the FLOPs per step (and its share)."""
  total = sum(d.flops * d.executions for d in dots) or 1.0
  table = collections.OrderedDict()
  for lib in (*LIBRARIES, "unknown"):
    mine = [d for d in dots if d.library == lib]
    if mine or lib in ("ynnpack", "onednn", "eigen"):
      flops = sum(d.flops * d.executions for d in mine)
      table[lib] = dict(dots=len(mine), executions=sum(d.executions for d in mine), flops=flops,
                        flop_share=flops / total)
  return table


def census(hlo_text: str) -> dict:
  """The census of one module: the per-library table, and every dot off the fast libraries with its reason."""
  dots = parse(hlo_text)
  left = [dict(name=d.name, library=d.library, op_name=d.op_name, shapes=d.shapes, dims=d.dims,
               executions=d.executions, gflops=d.flops * d.executions / 1e9, why=d.why)
          for d in dots if d.library in ("eigen", "xla", "unknown")]
  return dict(libraries=summarize(dots), total_gflops=sum(d.flops * d.executions for d in dots) / 1e9,
              dots=len(dots), slow_path=left)


def format_census(c: dict, title: str = "") -> str:
  """The census as a few lines of text: a table per library, then each dot left on Eigen/XLA and why (alike
  dots, e.g. one per unrolled layer, as one line)."""
  lines = [title] if title else []
  lines.append(f"{'library':<9} {'dots':>5} {'runs/step':>9} {'GFLOP/step':>11} {'share':>6}")
  for lib, row in c["libraries"].items():
    lines.append(f"{lib:<9} {row['dots']:>5} {row['executions']:>9} {row['flops'] / 1e9:>11.2f} "
                 f"{row['flop_share']:>6.1%}")
  # The same dot in every unrolled layer (the CPU unrolls them) is one line with its total runs per step.
  runs = collections.Counter()
  for d in c["slow_path"]:
    runs[d["library"], d["op_name"].split("/", 1)[-1][-70:], d["shapes"], d["why"] or d["dims"]] += d["executions"]
  for (library, op, shapes, why), n in runs.items():
    lines.append(f"  {library}: {op} {shapes} x{n}: {why}")
  return "\n".join(lines)


def of_compiled(compiled) -> dict:
  """The census of a jax compiled executable (`jax.jit(f).lower(...).compile()`)."""
  return census(compiled.as_text())

