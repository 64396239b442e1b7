"""`python -m bertjax.finetune.predict`: predictions of a fine-tuned model of any family -- labels
(classification), answers (squad), tags (tagging), choices (multiple choice) -- and the model exported to
transformers or saved as a bertjax task model.

  python -m bertjax.finetune.predict --model=W/seed_0/model --input=FILE [--out=FILE.jsonl | --out=DIR]
  python -m bertjax.finetune.predict --model=W/seed_0/model --text="A sentence ."         # classification, tagging
  python -m bertjax.finetune.predict --model=W/seed_0/model --question="..." --context="..."   # squad
  python -m bertjax.finetune.predict --model=W/seed_0/model --export=HF_DIR   # transformers' task class
  python -m bertjax.finetune.predict --model=HF_DIR --save=DIR                # HF task model -> bertjax

--model is a fine-tuned model (fine-tuning's WORKDIR/seed_S/model, written with --config.save_model=True) or a
transformers *ForSequenceClassification / *ForQuestionAnswering / *ForTokenClassification /
BertForMultipleChoice directory; its family decides the inputs it reads (docs/finetune_tasks.md):
  classification   --input: a GLUE-layout TSV (the fine-tuning run's columns); --lines: one text a line,
                   TAB between a pair's two texts; --text (and --text_b)
  squad            --input: a SQuAD JSON file (answers not needed); --question with --context
  tagging          --input: a CoNLL column file (words in the first column; a last column is gold, kept);
                   --lines: one sentence a line; --text: one sentence (split into words and punctuation)
  multiple_choice  --input: JSONL ({"context", "question", "choices"}, one a line) or SWAG's CSV (.csv)
The input is read and checked before the model is loaded. Output: one JSON object per example on stdout or in
--out=FILE.jsonl; --out=DIR writes the family's own prediction files (squad: predictions.json,
nbest_predictions.json, null_odds.json; tagging: predictions.conll; the others: predictions.jsonl).
"""

import json
import os
import sys

from bertjax.core.errors import UserError

INPUT_FLAGS = ("input", "lines", "text", "text_b", "question", "context")


def parse(argv: list):
  """The command line's arguments (argparse: a usage error is one line and exit 2)."""
  from bertjax.core.cli import ArgumentParser

  p = ArgumentParser(prog="python -m bertjax.finetune.predict", description=__doc__.split("\n")[0])
  p.add_argument("--model", default="", help="a fine-tuned model: WORKDIR/seed_S/model or a transformers task directory")
  p.add_argument("--input", default="", help="a file in the family's task format (see above)")
  p.add_argument("--lines", default="", help="a text file, one example a line (classification, tagging)")
  p.add_argument("--text", default="", help="one text (classification; tagging: a sentence to tag)")
  p.add_argument("--text_b", default="", help="classification: the pair's second text")
  p.add_argument("--question", default="", help="squad: a question (with --context)")
  p.add_argument("--context", default="", help="squad: the passage to answer from")
  p.add_argument("--out", default="", help="FILE.jsonl (JSON lines) or DIR (the family's own files); default stdout")
  p.add_argument("--seq_len", type=int, default=0, help="window length (0: the fine-tuning run's, else the family's default)")
  p.add_argument("--batch_size", type=int, default=32, help="rows a forward pass")
  p.add_argument("--export", default="", help="write the model as a transformers directory here")
  p.add_argument("--save", default="", help="write the model as a bertjax task model directory here")
  return p.parse_args(argv)


def finetune_config(model_dir: str):
  """The fine-tuning run's config (WORKDIR/config.json of a model at WORKDIR/seed_S/model), or None."""
  import ml_collections

  path = os.path.join(model_dir, os.pardir, os.pardir, "config.json")
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    config = json.load(f)
  return ml_collections.ConfigDict(config) if isinstance(config, dict) and "task" in config else None


def _check_args(args) -> bool:
  """Whether the arguments ask for predictions (UserError for a combination that does nothing)."""
  if not args.model:
    raise UserError("set --model to a fine-tuned model (WORKDIR/seed_S/model) or a transformers task directory")
  given = [f for f in INPUT_FLAGS if getattr(args, f)]
  if not given and not (args.export or args.save):
    raise UserError("give an input (--input, --lines, --text, --question with --context), --export or --save")
  if args.input and args.lines:
    raise UserError("give one of --input and --lines")
  if args.seq_len < 0 or args.batch_size < 1:
    raise UserError(f"--seq_len={args.seq_len} must be >= 0 and --batch_size={args.batch_size} >= 1")
  return bool(given)


def only_flags(args, allowed: tuple, kind: str) -> None:
  """UserError when an input flag the family `kind` does not read is given."""
  extra = [f"--{f}" for f in INPUT_FLAGS if getattr(args, f) and f not in allowed]
  if extra:
    raise UserError(f"{args.model} is a {kind} model, which reads {', '.join('--' + f for f in allowed)}; "
                    f"not {', '.join(extra)}")


def read_lines(path: str) -> list:
  """(line number, text) of every non-blank line of a UTF-8 text file (UserError naming the file when unreadable)."""
  if not os.path.isfile(path):
    raise UserError(f"{path}:0: no such file")
  try:
    with open(path, encoding="utf-8") as f:
      out = [(n, line.rstrip("\n")) for n, line in enumerate(f, 1) if line.strip()]
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text ({e.reason})") from None
  if not out:
    raise UserError(f"{path}:1: no lines to predict")
  return out


def write_jsonl(records: list, out) -> None:
  """One JSON object a line."""
  for r in records:
    out.write(json.dumps(r, ensure_ascii=False) + "\n")


def write_records(directory: str, records: list) -> list:
  """predictions.jsonl (the records) in `directory`, a family's own output where it has no file of its own;
  returns [its path]."""
  path = os.path.join(directory, "predictions.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    write_jsonl(records, f)
  return [path]


def run(args) -> list:
  """Reads the input (before the model is loaded: a bad file fails in seconds), loads the model, predicts,
  writes, exports; returns the JSONL records."""
  from bertjax.finetune import task_models, tasks

  wants = _check_args(args)
  if not os.path.isdir(args.model):
    raise UserError(f"--model={args.model!r} is not a directory; point it at WORKDIR/seed_S/model or a "
                    "transformers task directory")
  kind = task_models.kind_of_dir(args.model)
  fam = tasks.family(kind)
  if wants and fam.predict is None:
    raise UserError(f"{args.model} is a {kind} model, which this command does not predict with; its fine-tuning run "
                    "evaluates it and writes its predictions (seed_S/)")
  inputs = fam.predict.read_inputs(args, finetune_config(args.model)) if wants else None
  tm = task_models.load(args.model)
  records = []
  if wants:
    if tm.tokenizer is None:
      raise UserError(f"{args.model} has no tokenizer; copy the checkpoint's tokenizer files next to it")
    result = fam.predict.predict(tm, inputs, args, finetune_config(args.model))
    records = fam.predict.records(result)
    if args.out and not args.out.endswith(".jsonl"):
      os.makedirs(args.out, exist_ok=True)
      for path in fam.predict.write(args.out, result):
        print(f"wrote {path}", file=sys.stderr)
    elif args.out:
      os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
      with open(args.out, "w", encoding="utf-8") as f:
        write_jsonl(records, f)
      print(f"wrote {args.out}", file=sys.stderr)
    else:
      write_jsonl(records, sys.stdout)
  if args.export:
    print(f"wrote {task_models.write_hf(tm, args.export)}", file=sys.stderr)
  if args.save:
    info = dict(tm.info, tokenizer=tm.tokenizer.spec() if tm.tokenizer is not None else "")
    task_models.save(args.save, tm.kind, tm.config, tm.params, info)
    print(f"wrote {args.save}", file=sys.stderr)
  return records


def main(argv: list) -> int:
  """The CLI; one-line errors and exit 2 on bad input."""
  try:
    run(parse(argv))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from bertjax.core import runtime

  runtime.setup()  # the platform and JAX flags of every command (not in `main`, which tests call in-process)
  sys.exit(main(sys.argv[1:]))
