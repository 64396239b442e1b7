"""The suite's tasks (GLUE's eight, and the hook where SQuAD and NER join), the papers' recipes, and the
table a paper prints: per-task metrics as medians over seeds, and the GLUE average as each paper takes it."""

import dataclasses
import json
import os

import numpy as np


@dataclasses.dataclass(frozen=True)
class SuiteTask:
  """A task the suite can run.

  folder   its directory under --glue_dir (GLUE's official name)
  config   the config spec whose `task` section it uses (file:arg); the run's other settings come from --config
  tfds     its tfds name, for --source=tfds
  columns  (heading, metric key) of its table cells, in the papers' order (keys from results.json's summary)
  """

  folder: str
  config: str
  tfds: str
  columns: tuple


# The suite's tasks in GLUE's order. SQuAD (#32) and NER (#33) join by adding an entry here with their own
# config spec (e.g. "configs/squad.py:v1"), folder under --glue_dir (or its own root flag) and columns, and
# an entry in AVERAGES' `extra` lists if a paper averages them; the suite loop is task-agnostic.
TASKS = {
    "cola": SuiteTask("CoLA", "configs/finetune.py:cola", "glue/cola", (("MCC", "mcc"),)),
    "sst2": SuiteTask("SST-2", "configs/finetune.py:sst2", "glue/sst2", (("Acc", "accuracy"),)),
    "mrpc": SuiteTask("MRPC", "configs/finetune.py:mrpc", "glue/mrpc", (("F1", "f1"), ("Acc", "accuracy"))),
    "stsb": SuiteTask("STS-B", "configs/finetune.py:stsb", "glue/stsb", (("Pearson", "pearson"), ("Spearman", "spearman"))),
    "qqp": SuiteTask("QQP", "configs/finetune.py:qqp", "glue/qqp", (("F1", "f1"), ("Acc", "accuracy"))),
    "mnli": SuiteTask("MNLI", "configs/finetune.py:mnli", "glue/mnli", (("m", "accuracy"), ("mm", "accuracy_mismatched"))),
    "qnli": SuiteTask("QNLI", "configs/finetune.py:qnli", "glue/qnli", (("Acc", "accuracy"),)),
    "rte": SuiteTask("RTE", "configs/finetune.py:rte", "glue/rte", (("Acc", "accuracy"),)),
}
DEFAULT_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")

# Recipes: the config values each paper fine-tunes GLUE with (keys as in configs/finetune.py); `per_task`
# overrides them for some tasks. Explicit --config.* overrides win over a recipe.
RECIPES = {
    # BERT (Devlin et al. 2019, §4.1): "batch size of 32 and fine-tune for 3 epochs over the data for all GLUE
    # tasks. For each task, we selected the best fine-tuning learning rate (among 5e-5, 4e-5, 3e-5, and 2e-5)
    # on the Dev set" (a grid: --learning_rates); 2e-5 alone is google-research/bert README's run_classifier
    # example. Warmup 10% then linear decay: run_classifier.py's warmup_proportion=0.1 and
    # optimization.py's polynomial decay to 0. No layer-wise decay.
    "bert": dict(common=dict(batch_size=32, epochs=3.0, learning_rate=2e-5, warmup_fraction=0.1,
                             optimizer=dict(schedule="linear", layerwise_decay=1.0)), per_task={}),
    # ELECTRA (Clark et al. 2020, Appendix A, Table 7, fine-tuning hyperparameters): lr 1e-4 for Base
    # (3e-4 Small, 5e-5 Large), layer-wise lr decay 0.8 (Large 0.9), warmup fraction 0.1, batch 32,
    # "10 epochs for RTE and STS-B, 3 for the other tasks"; google-research/electra's linear decay after
    # warmup (bertjax.optim's `electra` schedule).
    "electra": dict(common=dict(batch_size=32, epochs=3.0, learning_rate=1e-4, warmup_fraction=0.1,
                                optimizer=dict(schedule="electra", layerwise_decay=0.8)),
                    per_task=dict(rte=dict(epochs=10.0), stsb=dict(epochs=10.0))),
}
RECIPES["electra_small"] = dict(RECIPES["electra"], common={**RECIPES["electra"]["common"], "learning_rate": 3e-4})
RECIPES["electra_large"] = dict(RECIPES["electra"], common={
    **RECIPES["electra"]["common"], "learning_rate": 5e-5, "optimizer": dict(schedule="electra", layerwise_decay=0.9)})
RECIPES["none"] = dict(common={}, per_task={})  # the --config file's own values


def recipe_values(recipe: str, task: str) -> dict:
  """The (nested) config values `recipe` sets for `task`."""
  r = RECIPES[recipe]
  values = {k: (dict(v) if isinstance(v, dict) else v) for k, v in r["common"].items()}
  values.update(r["per_task"].get(task, {}))
  return values


# How each paper averages GLUE: (task, metric) cells, all scaled by 100. BERT's Table 1 "Average" (WNLI
# excluded) counts MNLI-m and MNLI-mm as two entries and uses F1 for QQP and MRPC, Spearman for STS-B,
# MCC for CoLA, accuracy otherwise (9 numbers). ELECTRA §3.1: "Spearman correlation for STS, Matthews
# correlation for CoLA, and accuracy for the other GLUE tasks", MNLI matched (8 numbers).
AVERAGES = {
    "bert": (("mnli", "accuracy"), ("mnli", "accuracy_mismatched"), ("qqp", "f1"), ("qnli", "accuracy"),
             ("sst2", "accuracy"), ("cola", "mcc"), ("stsb", "spearman"), ("mrpc", "f1"), ("rte", "accuracy")),
    "electra": (("cola", "mcc"), ("sst2", "accuracy"), ("mrpc", "accuracy"), ("stsb", "spearman"), ("qqp", "accuracy"),
                ("mnli", "accuracy"), ("qnli", "accuracy"), ("rte", "accuracy")),
}


def averages(rows: dict) -> dict:
  """paper -> dict(value, covers, missing): the mean of the paper's cells over the tasks that finished."""
  out = {}
  for paper, cells in AVERAGES.items():
    have = [(t, m) for t, m in cells if rows.get(t, {}).get("metrics", {}).get(m) is not None]
    values = [rows[t]["metrics"][m] for t, m in have]
    out[paper] = dict(value=100 * float(np.mean(values)) if values else None,
                      covers=sorted({t for t, _ in have}), missing=sorted({t for t, _ in cells} - {t for t, _ in have}),
                      cells=len(have), of=len(cells))
  return out


def _cell(row: dict, metric: str) -> str:
  v = row.get("metrics", {}).get(metric)
  return "-" if v is None else f"{100 * v:.1f}"


def render(rows: dict, meta: dict) -> str:
  """glue.md: one row per task (median over seeds, x100), then each paper's average and what it covers."""
  lines = [f"# GLUE dev results ({meta['recipe']} recipe, median over {meta['seeds']} seed(s))", "",
           f"checkpoint: `{meta['checkpoint']}`; data: `{meta['data']}`", "",
           "| task | metrics | score | learning rate | seeds | time | note |", "|---|---|---|---|---|---|---|"]
  for task, row in rows.items():
    cols = TASKS[task].columns
    score = "/".join(_cell(row, key) for _, key in cols)
    lr = "-" if row.get("learning_rate") is None else f"{row['learning_rate']:g}"
    secs = row.get("seconds")
    time_s = "-" if secs is None else f"{secs / 60:.1f} min"
    lines.append(f"| {TASKS[task].folder} | {'/'.join(h for h, _ in cols)} | {score} | {lr} | "
                 f"{row.get('seeds', '-')} | {time_s} | {row.get('note', '')} |")
  lines.append("")
  for paper, avg in averages(rows).items():
    value = "-" if avg["value"] is None else f"{avg['value']:.1f}"
    scope = "all tasks" if not avg["missing"] else (f"partial: {avg['cells']} of {avg['of']} cells, over "
                                                   f"{', '.join(avg['covers']) or 'no task'}; missing "
                                                   f"{', '.join(avg['missing'])}")
    lines.append(f"- average as {paper.upper()} computes it: **{value}** ({scope})")
  return "\n".join(lines) + "\n"


def write(workdir: str, rows: dict, meta: dict) -> None:
  """Writes WORKDIR/glue.json (rows, averages, how they were made) and WORKDIR/glue.md."""
  with open(os.path.join(workdir, "glue.json"), "w") as f:
    json.dump(dict(meta, tasks=rows, averages=averages(rows)), f, indent=2)
  with open(os.path.join(workdir, "glue.md"), "w") as f:
    f.write(render(rows, meta))
