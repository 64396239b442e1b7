"""The package's layering (docs/layout.md): every import in bertjax/, at module level or inside a function,
points down or sideways, never up, and no modules import each other in a circle; and the top level stays
small, with one module per name that says what it does.

Layers, bottom to top: 1 core; 2 model, data, objectives; 3 train (pretraining steps and runs); 4 finetune,
compress, hf; 5 command lines (`__main__` modules, the top-level mains, data.prepare).
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "bertjax"
LAYERS = {"core": 1, "model": 2, "data": 2, "objectives": 2, "train": 3, "finetune": 4, "compress": 4, "hf": 4}
COMMAND_LINES = {"bertjax.distill", "bertjax.summary", "bertjax.aot", "bertjax.data.prepare"}
TOP_LEVEL = {"__init__.py", "core", "model", "data", "objectives", "train", "finetune", "compress", "hf",
             "distill.py", "summary.py", "aot.py"}


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  """bertjax/train/loop.py -> bertjax.train.loop; a package's __init__.py -> the package."""
  parts = list(path.relative_to(root.parent).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: pathlib.Path = PACKAGE) -> dict:
  """Module name -> its file, for every .py file under `root`."""
  return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(root: pathlib.Path = PACKAGE) -> dict:
  """Module -> {(imported module, line)}: every `import` and `from ... import` anywhere in its file (lazy
  imports in functions included), resolved to the package's own modules (`from bertjax.core import config`
  -> bertjax.core.config; `from bertjax.model.encoder import X` -> bertjax.model.encoder)."""
  known = modules(root)
  graph = {}
  for name, path in known.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[: len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
      else:
        continue
      for target in targets:
        while target and target not in known:  # `import bertjax.x.y` of a name inside a module
          target = target.rpartition(".")[0]
        if target and target.startswith(root.name) and target != name:
          edges.add((target, node.lineno))
    graph[name] = edges
  return graph


def layer(module: str) -> int:
  """The layer of a module of bertjax (0: the package's own __init__, which imports nothing)."""
  parts = module.split(".")
  if module in COMMAND_LINES or parts[-1] == "__main__":
    return 5
  if len(parts) == 1:
    return 0
  return LAYERS[parts[1]]


def upward(graph: dict) -> list:
  """"a:LINE imports b (layer i -> j)" for every import from a lower layer to a higher one."""
  return sorted(f"{a}:{line} imports {b} (layer {layer(a)} -> {layer(b)})"
                for a, edges in graph.items() for b, line in edges if layer(b) > layer(a))


def circles(graph: dict) -> list:
  """The import circles: each strongly connected set of two or more modules (Tarjan), sorted."""
  adjacency = {a: sorted({b for b, _ in edges}) for a, edges in graph.items()}
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in adjacency.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(adjacency):
    if v not in index:
      visit(v)
  return sorted(found)


def test_every_module_has_a_layer():
  unplaced = [m for m in modules() if m.count(".") >= 1 and m.split(".")[1] not in LAYERS
              and m not in COMMAND_LINES and not m.endswith("__main__")]
  assert not unplaced, f"modules outside the layers (place them in LAYERS or COMMAND_LINES): {unplaced}"


def test_no_import_runs_up_a_layer():
  found = upward(imports())
  assert not found, "imports that run up a layer (docs/layout.md says where things go):\n" + "\n".join(found)


def test_no_import_circle():
  found = circles(imports())
  assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_catch_a_back_edge_and_a_circle(tmp_path):
  """The walker on a small package: a lazy import from the core up into train, and two modules of one layer
  importing each other."""
  root = tmp_path / "bertjax"
  for d in ("core", "train", "model"):
    (root / d).mkdir(parents=True)
    (root / d / "__init__.py").write_text("")
  (root / "__init__.py").write_text("")
  (root / "core" / "config.py").write_text("def f():\n  from bertjax.train import loop\n")
  (root / "train" / "loop.py").write_text("from bertjax.core import config\n")
  (root / "model" / "a.py").write_text("from bertjax.model import b\n")
  (root / "model" / "b.py").write_text("from . import a\n")
  graph = imports(root)
  assert upward(graph) == ["bertjax.core.config:2 imports bertjax.train.loop (layer 1 -> 3)"]
  assert circles(graph) == [["bertjax.core.config", "bertjax.train.loop"], ["bertjax.model.a", "bertjax.model.b"]]


def test_the_top_level_is_small_and_one_module_is_named_heads():
  top = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
  assert top <= TOP_LEVEL, f"new top-level entries {sorted(top - TOP_LEVEL)}: put them in a package (docs/layout.md)"
  assert len(top) <= 12
  assert [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("heads.py")] == ["model/heads.py"]


MAX_LINES = 450  # a module a newcomer reads in one sitting (DESIGN.md: ~400); a longer one is split into parts


def test_no_module_is_over_450_lines():
  long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines: {long}; split them (docs/layout.md)"
