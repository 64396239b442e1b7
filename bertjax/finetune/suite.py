"""`python -m bertjax.finetune.suite`: fine-tune one checkpoint on a list of GLUE tasks, each with its paper's
recipe, over seeds (and a learning-rate grid), and write the table a paper prints (WORKDIR/glue.md, glue.json).

  python -m bertjax.finetune.suite --config=configs/finetune.py --config.init.checkpoint=CKPT \\
      --glue_dir=/data/glue --recipe=bert --seeds=5 --learning_rates=2e-5,3e-5,4e-5,5e-5 --workdir=W

Each task runs in WORKDIR/TASK (WORKDIR/TASK/lr_LR per grid point; WORKDIR/TASK/results.json then holds the
best one, chosen on the dev set by the task's headline metric, as BERT's paper selects). A task whose
results.json exists is skipped on a rerun, so an interrupted suite resumes. Config precedence: the --config
file < the recipe < --config.* overrides < --learning_rates and --seeds; task.name and task.source are the
suite's. The tasks: bertjax.finetune.classification.glue.TASKS (where SQuAD and NER join).
"""

import json
import os
import shutil
import sys
import time

from bertjax.core.errors import UserError
from bertjax.finetune.classification import glue

SOURCES = ("tsv", "tfds")


def parse_tasks(spec: str) -> list:
  """The task names of --tasks, in order (a UserError naming the unknown ones)."""
  names = [t.strip().lower() for t in spec.split(",") if t.strip()]
  unknown = [t for t in names if t not in glue.TASKS]
  if unknown or not names:
    raise UserError(f"unknown task(s) {', '.join(unknown) or '(none given)'} in --tasks; use {', '.join(glue.TASKS)}")
  return names


def parse_rates(spec: str) -> list:
  """The learning rates of --learning_rates ([] when empty: the recipe's rate)."""
  try:
    rates = [float(x) for x in spec.split(",") if x.strip()]
  except ValueError:
    raise UserError(f"--learning_rates={spec!r}; use numbers like 2e-5,3e-5,5e-5") from None
  if any(r <= 0 for r in rates):
    raise UserError(f"--learning_rates={spec!r}: rates must be positive")
  return rates


def _set(config, dotted: str, value):
  *path, key = dotted.split(".")
  node = config
  for p in path:
    node = node[p]
  node[key] = value


def _merge(config, values: dict, prefix=""):
  for k, v in values.items():
    if isinstance(v, dict):
      _merge(config, v, f"{prefix}{k}.")
    else:
      _set(config, prefix + k, v)


def _config_path(spec: str) -> str:
  """A task's config spec, its file found in the repository's configs/ when not under the working directory."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(repo, path)
  return f"{path}:{arg}" if arg else path


def task_config(base, overrides: dict, task: str, recipe: str, source: str, root: str, seeds: int,
                learning_rate: float | None):
  """The fine-tuning config of one task (and grid point): `base` (the --config file) with the task's `task`
  section, then the recipe, then the --config.* `overrides`, then the suite's own settings."""
  from bertjax.core import config as config_lib

  spec = glue.TASKS[task]
  c = base.copy_and_resolve_references()
  c.unlock()
  c.task = config_lib.load(_config_path(spec.config)).task
  _merge(c, glue.recipe_values(recipe, task))
  for key, value in overrides.items():
    _set(c, key, value)
  c.task.name = task
  c.task.source = f"tsv:{os.path.join(root, spec.folder)}" if source == "tsv" else f"tfds:{spec.tfds}"
  if seeds:
    c.seeds = seeds
  if learning_rate is not None:
    c.learning_rate = learning_rate
  return c


def missing_data(task: str, source: str, root: str) -> str:
  """Why `task` cannot run from --glue_dir (its folder or train.tsv absent), or ''."""
  if source != "tsv":
    return ""
  folder = os.path.join(root, glue.TASKS[task].folder)
  if not os.path.isfile(os.path.join(folder, "train.tsv")):
    return f"missing: no {os.path.join(folder, 'train.tsv')}"
  return ""


def work_units(config) -> float:
  """A task's expected cost for the ETA: training steps x seeds, from the TSV's row count (tfds: 1 unit)."""
  from bertjax.finetune import train

  kind, _, arg = config.task.source.partition(":")
  if kind != "tsv":
    return float(config.seeds)
  with open(os.path.join(arg, "train.tsv"), "rb") as f:
    rows = sum(1 for _ in f) - int(config.task.header)
  if config.task.max_train_examples:
    rows = min(rows, config.task.max_train_examples)
  return float(train.step_counts(config, max(rows, 1))[0] * config.seeds)


def _headline(results: dict) -> float:
  first = next(iter(results["summary"]))
  return results["summary"][first]["median"]


def run_task(configs: list, task_dir: str) -> tuple[dict, dict]:
  """Runs a task's grid points (each skipped if its results.json exists); returns (best results, grid)
  and writes the best one as task_dir/results.json."""
  from bertjax.finetune import train

  if len(configs) == 1:
    return train.finetune(configs[0], task_dir), {}
  grid = {}
  for c in configs:
    run_dir = os.path.join(task_dir, f"lr_{c.learning_rate:g}")
    done = os.path.join(run_dir, "results.json")
    if os.path.isfile(done):
      with open(done) as f:
        grid[c.learning_rate] = json.load(f)
      print(f"  {c.task.name} lr {c.learning_rate:g}: finished ({done}), skipped", flush=True)
    else:
      grid[c.learning_rate] = train.finetune(c, run_dir)
  best = max(grid, key=lambda lr: _headline(grid[lr]))
  results = dict(grid[best], learning_rate=best, grid={f"{lr:g}": _headline(r) for lr, r in grid.items()})
  with open(os.path.join(task_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  shutil.copy(os.path.join(task_dir, f"lr_{best:g}", "config.json"), os.path.join(task_dir, "config.json"))
  return results, results["grid"]


def row_of(results: dict, seconds: float | None, note: str = "") -> dict:
  """A glue.json row from a task's results.json."""
  return dict(metrics={k: v["median"] for k, v in results["summary"].items()},
              per_seed=results["per_seed"], seeds=len(results["per_seed"]),
              learning_rate=results.get("learning_rate"),
              grid=results.get("grid", {}), seconds=seconds if seconds is not None else results.get("suite_seconds"),
              note=note)


def _fmt_time(seconds: float) -> str:
  m, s = divmod(int(round(seconds)), 60)
  h, m = divmod(m, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def run_suite(base, overrides: dict, workdir: str, tasks: list, recipe: str = "bert", source: str = "tsv",
              glue_dir: str = "", seeds: int = 0, learning_rates: list = ()) -> dict:
  """Runs the suite; returns the glue.json rows (task -> row). Writes the table after every task."""
  if recipe not in glue.RECIPES:
    raise UserError(f"--recipe={recipe!r}; use one of {', '.join(glue.RECIPES)}")
  if source not in SOURCES:
    raise UserError(f"--source={source!r}; use tsv (with --glue_dir) or tfds")
  if source == "tsv" and not os.path.isdir(glue_dir or ""):
    raise UserError(f"--glue_dir={glue_dir!r} is not a directory; point it at a GLUE root (CoLA/, SST-2/, ...) "
                    "or use --source=tfds")
  os.makedirs(workdir, exist_ok=True)
  meta = dict(recipe=recipe, seeds=seeds or base.seeds, learning_rates=list(learning_rates), source=source,
              data=glue_dir if source == "tsv" else "tfds", checkpoint=base.init.checkpoint,
              overrides={k: v for k, v in overrides.items()})
  plans = {}
  for task in tasks:
    why = missing_data(task, source, glue_dir)
    rates = list(learning_rates) or [None]
    configs = [] if why else [task_config(base, overrides, task, recipe, source, glue_dir, seeds, lr) for lr in rates]
    plans[task] = (why, configs, sum(work_units(c) for c in configs))
  rows, t_suite, done_units, spent = {}, time.time(), 0.0, 0.0
  total_units = sum(units for why, _, units in plans.values() if not why)
  for i, task in enumerate(tasks, 1):
    why, configs, units = plans[task]
    task_dir = os.path.join(workdir, task)
    finished = os.path.join(task_dir, "results.json")
    if why:
      rows[task] = dict(metrics={}, note=why)
      print(f"[{i}/{len(tasks)}] {task}: {why}; reported in the table", flush=True)
    elif os.path.isfile(finished):
      with open(finished) as f:
        rows[task] = row_of(json.load(f), None, "from an earlier run")
      total_units -= units
      print(f"[{i}/{len(tasks)}] {task}: finished earlier ({finished}), skipped", flush=True)
    else:
      t0 = time.time()
      results, _ = run_task(configs, task_dir)
      seconds = time.time() - t0
      results = dict(results, suite_seconds=seconds)
      results.setdefault("learning_rate", configs[0].learning_rate)
      with open(finished, "w") as f:
        json.dump(results, f, indent=2)
      rows[task] = row_of(results, seconds)
      done_units, spent = done_units + units, spent + seconds
      eta = spent / done_units * (total_units - done_units) if done_units else 0.0
      headline = ", ".join(f"{k} {v:.4f}" for k, v in rows[task]["metrics"].items())
      print(f"[{i}/{len(tasks)}] {task}: {headline} (median of {rows[task]['seeds']} seed(s)) in "
            f"{_fmt_time(seconds)}; suite ETA {_fmt_time(eta)}", flush=True)
    glue.write(workdir, rows, meta)
  print(f"suite: {len(tasks)} task(s) in {_fmt_time(time.time() - t_suite)}; table in "
        f"{os.path.join(workdir, 'glue.md')}", flush=True)
  for paper, avg in glue.averages(rows).items():
    if avg["value"] is not None:
      print(f"average as {paper.upper()} computes it: {avg['value']:.1f} over {', '.join(avg['covers'])}"
            f"{'' if not avg['missing'] else ' (partial)'}", flush=True)
  return rows


def main():
  """The command line (absl flags, ml_collections --config with --config.* overrides)."""
  from absl import flags
  from ml_collections import config_flags

  from bertjax.core.cli import cli, run

  config = config_flags.DEFINE_config_file("config", "configs/finetune.py", "base fine-tuning config, e.g. "
                                           "configs/finetune.py or configs/finetune.py:tiny", lock_config=True)
  f_tasks = flags.DEFINE_string("tasks", ",".join(glue.DEFAULT_TASKS), f"tasks to run, of {', '.join(glue.TASKS)}")
  f_dir = flags.DEFINE_string("glue_dir", "", "GLUE root holding CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/, RTE/")
  f_source = flags.DEFINE_enum("source", "tsv", list(SOURCES), "tsv (--glue_dir) or tfds (glue/* datasets)")
  f_recipe = flags.DEFINE_string("recipe", "bert", f"per-task recipe: {', '.join(glue.RECIPES)}")
  f_seeds = flags.DEFINE_integer("seeds", 0, "seeds per task (0: the config's)")
  f_rates = flags.DEFINE_string("learning_rates", "", "learning-rate grid, best on dev per task (e.g. 2e-5,3e-5,5e-5)")
  f_workdir = flags.DEFINE_string("workdir", None, "where WORKDIR/TASK/..., glue.md and glue.json go")
  flags.mark_flags_as_required(["workdir"])

  @cli
  def entry(argv):
    del argv
    tasks, rates = parse_tasks(f_tasks.value), parse_rates(f_rates.value)
    if f_seeds.value < 0:
      raise UserError(f"--seeds={f_seeds.value} must be >= 1 (or 0: the config's)")
    from bertjax.core import runtime

    runtime.setup()
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    run_suite(config.value, overrides, f_workdir.value, tasks, f_recipe.value, f_source.value, f_dir.value,
              f_seeds.value, rates)

  run(entry)


if __name__ == "__main__":
  sys.exit(main())
