"""Extractive-QA models in and out: a fine-tuned SpanQA saved as a bertjax model directory, transformers'
*ForQuestionAnswering checkpoints (BERT, RoBERTa, ALBERT, ELECTRA: `qa_outputs`) imported and exported, and
answering a question from a context.

  python -m bertjax.finetune.qa_io answer --model=W/seed_0/model --question="..." --context="..."
  python -m bertjax.finetune.qa_io answer --hf_dir=HF_QA_DIR --question="..." --context="..."
  python -m bertjax.finetune.qa_io export --model=W/seed_0/model --out=HF_DIR   # -> *ForQuestionAnswering
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import UserError
from bertjax.hf import configs as hf_configs, convert, safetensors_io, tokenizers as hf_tokenizers, weights as W
from bertjax.finetune.model import restore_params
from bertjax.finetune.qa_model import SpanQA

QA_FILE = "qa.json"  # beside a saved model's config.json: the head and the task settings it was trained with
ARCH = {"bert": "BertForQuestionAnswering", "roberta": "RobertaForQuestionAnswering",
        "albert": "AlbertForQuestionAnswering", "electra": "ElectraForQuestionAnswering"}


def read_head(hf_dir: str) -> dict | None:
  """{"qa_outputs": {"kernel" [H, 2], "bias" [2]}} of an HF *ForQuestionAnswering directory, else None."""
  is_hf = os.path.isfile(os.path.join(hf_dir, "config.json")) and not os.path.isdir(os.path.join(hf_dir, "checkpoints"))
  if not is_hf:  # a bertjax workdir (pretraining run or import) has no span head
    return None
  tensors = safetensors_io.read_dir(hf_dir)
  if "qa_outputs.weight" not in tensors:
    return None
  return {"qa_outputs": {"kernel": np.asarray(tensors["qa_outputs.weight"], np.float32).T.copy(),
                         "bias": np.asarray(tensors["qa_outputs.bias"], np.float32)}}


def read_hf(hf_dir: str) -> tuple:
  """(run config, SpanQA, params, tokenizer) of an HF *ForQuestionAnswering checkpoint."""
  from bertjax.model import config as model_config

  head = read_head(hf_dir)
  if head is None:
    raise UserError(f"{hf_dir} has no qa_outputs; give a *ForQuestionAnswering checkpoint")
  imp = convert.read_hf(hf_dir)
  model = SpanQA(model_config.encoder_config(imp.config.model), deterministic=True)
  params = {"embeddings": imp.params["embeddings"], "encoder": imp.params["encoder"], **head}
  return imp.config, model, jax.tree.map(jnp.asarray, params), imp.tokenizer


def write_hf(run_config, params, out_dir: str, tokenizer=None) -> str:
  """Exports a SpanQA model (span head only) as transformers' *ForQuestionAnswering of its family."""
  family = hf_configs.family_for(run_config)
  if family not in ARCH:
    raise UserError(f"transformers has no {family} question-answering class bertjax exports to")
  if "answerable" in params:
    raise UserError("the answerable head has no transformers class; export a model trained without it")
  special = tokenizer.special if tokenizer else convert.SpecialIds(0, 1, 2, 3, 4)
  params = jax.tree.map(np.asarray, params)
  hf = hf_configs.to_hf(run_config, family, ARCH[family], special)
  tensors = convert.encoder_tensors(run_config, params, family, special)
  tensors.update(W.export_tensors(W.entries_of("qa_outputs", "qa_outputs"), params))
  return convert.write_dir(out_dir, hf, tensors, tokenizer)


def save_model(directory: str, run_config, model: SpanQA, params) -> None:
  """Writes a fine-tuned SpanQA: config.json (its encoder's run config, whose data.tokenizer names the
  tokenizer), the params checkpoint, and qa.json (answerable head; the window and post-processing
  settings it was trained with)."""
  from bertjax.hf import workdir as wd

  head = dict(answerable_head=model.answerable_head, **dict(model.settings))
  wd.write(directory, run_config, params, dict(head=head))
  with open(os.path.join(directory, QA_FILE), "w") as f:
    json.dump(head, f, indent=2)


def load_model(directory: str) -> tuple:
  """(run config, SpanQA, params, tokenizer, qa.json settings) of a model written by `save_model`."""
  from bertjax.model import config as model_config
  from bertjax.hf import workdir as wd

  path = os.path.join(directory, QA_FILE)
  if not os.path.isfile(path):
    raise UserError(f"no fine-tuned QA model at {directory!r} (no {QA_FILE}); fine-tune SQuAD with "
                    "--config.save_model=True, which writes WORKDIR/seed_S/model")
  with open(path) as f:
    head = json.load(f)
  run_config = wd.load_config(directory)
  model = SpanQA(model_config.encoder_config(run_config.model), deterministic=True,
                 answerable_head=head["answerable_head"])
  params = restore_params(directory, model)
  spec = run_config.data.get("tokenizer", "")
  tok = hf_tokenizers.load_any(spec) if spec else None
  head.pop("answerable_head")
  return run_config, model, params, tok, head


def answer(model: SpanQA, params, tokenizer, question: str, context: str, settings: dict | None = None) -> dict:
  """The best answer to `question` from `context` ("" when a v2.0 model's null odds exceed its threshold),
  with its n-best list: the SQuAD windows and post-processing of training, for one question."""
  from bertjax.finetune import squad_data, squad_features, squad_post

  s = {**dict(version="2.0", doc_stride=128, max_query_length=64, n_best_size=20, max_answer_length=30,
              null_score_diff_threshold=0.0, seq_len=384), **(settings or {})}  # run_squad.py's defaults
  q = squad_data.Question("q", question, context, (), -1, True)
  w = squad_features.build([q], tokenizer, s["seq_len"], s["doc_stride"], s["max_query_length"])
  a = w.arrays
  out = np.asarray(jax.jit(model.apply)({"params": params}, a["input_ids"], a["type_ids"], a["groups"]))
  start, end = squad_post.span_logits(out)
  preds, nbest, odds = squad_post.predict([q], w, start, end, s["n_best_size"], s["max_answer_length"],
                                          s["version"] == "2.0", s["null_score_diff_threshold"])
  return dict(answer=preds["q"], null_odds=odds.get("q"), nbest=nbest["q"][:5])


def main(argv: list) -> int:
  """The CLI (see the module docstring); one-line errors, exit 2."""
  from bertjax.core.cli import ArgumentParser

  p = ArgumentParser(prog="python -m bertjax.finetune.qa_io")
  p.add_argument("command", choices=("answer", "export"))
  p.add_argument("--model", default="", help="a fine-tuned QA model directory (WORKDIR/seed_S/model)")
  p.add_argument("--hf_dir", default="", help="answer: an HF *ForQuestionAnswering checkpoint instead")
  p.add_argument("--question", default="")
  p.add_argument("--context", default="")
  p.add_argument("--seq_len", type=int, default=0, help="window length (0: the model's own, else 384)")
  p.add_argument("--out", default="", help="export: the directory to write")
  args = p.parse_args(argv)
  try:
    if bool(args.model) == bool(args.hf_dir):
      raise UserError("give exactly one of --model (a fine-tuned bertjax QA model) and --hf_dir")
    if args.model:
      run_config, model, params, tok, settings = load_model(args.model)
    else:
      run_config, model, params, tok = read_hf(args.hf_dir)
      settings = {}
    if args.command == "export":
      if not args.out:
        raise UserError("export needs --out=DIR")
      print(f"wrote {write_hf(run_config, params, args.out, tok)}")
      return 0
    if not args.question or not args.context:
      raise UserError("answer needs --question and --context")
    if tok is None:
      raise UserError("the model has no tokenizer files")
    if args.seq_len:
      settings = dict(settings, seq_len=args.seq_len)
    result = answer(model, params, tok, args.question, args.context, settings)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(result, indent=2, ensure_ascii=False))
  return 0


if __name__ == "__main__":
  from bertjax.core import runtime

  runtime.setup()
  sys.exit(main(sys.argv[1:]))
