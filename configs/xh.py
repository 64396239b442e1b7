"""Transformer-XH (Zhao, Xiong, Rosset, Song, Bennett, Tiwary, ICLR 2020, "Transformer-XH: Multi-Evidence Reasoning
with eXtra Hop Attention"): fine-tuning over graphs of linked passages, each passage's [CLS] attending over the
[CLS] of the passages linked to it after the last layers (bertjax.model.xh; bertjax.finetune.graph; docs/models.md).

  python -m bertjax.finetune --config=configs/xh.py:fever --config.init.checkpoint=CKPT \\
      --config.task.source=jsonl:DIR --workdir=W        # graph classification (DIR/train.jsonl, DIR/dev.jsonl)
  python -m bertjax.finetune --config=configs/xh.py:hotpot ...                 # span extraction over a graph
  python -m bertjax.finetune --config=configs/xh.py:tiny --config.init.checkpoint=/tmp/bert-tiny \\
      --config.task.source=jsonl:/data/graphs --workdir=/tmp/ft-xh             # CPU, a minute

Recipe: the authors' code (github.com/microsoft/Transformer-XH @953d8d4, transformer-xh/configs/config_hotpot.json,
config_fever.json, model/model.py): BERT-base, passages of 300 tokens, hops after layers 9, 10 and 11 (gnn_layer 9),
a 12-head graph attention of 64 per head, learning rate 1e-5, 2 epochs, one graph a batch. The trainer, init and
optimizer sections are configs/finetune.py's (BERT's AdamW with 10% warmup and linear decay); the code's warmup is
0 (warmup_proportion) and its optimizer pytorch_transformers' AdamW, so those two are ours, not theirs.
"""

import os

from bertjax.core.config import load

# name: (target, labels, what it is)
PRESETS = {
    "fever": ("classification", "SUPPORTS,REFUTES,NOT ENOUGH INFO", "FEVER-style claims over linked evidence"),
    "hotpot": ("span", "", "HotpotQA-style answer span in one of the linked passages"),
    "tiny": ("classification", "0,1", "CPU smoke size: graph classification on the data the tests write"),
    "tiny_span": ("span", "", "CPU smoke size: span extraction on the data the tests write"),
}


def get_config(arg: str = "fever"):
  """`arg`: fever | hotpot | tiny | tiny_span."""
  if arg not in PRESETS:
    raise ValueError(f"unknown Transformer-XH preset {arg!r}; use one of {', '.join(PRESETS)}")
  target, labels, _ = PRESETS[arg]
  c = load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "finetune.py:sst2"))  # the shared sections
  c.model.head = "pooler"  # the node heads read BERT's pooled [CLS] (model.py: outputs[1] = pooler(sequence_output))
  c.task = dict(
      kind="graph",  # bertjax.finetune.graph
      name=arg,
      target=target,  # classification (a label per graph) | span (an answer in one of its passages)
      source="",  # jsonl:DIR, one graph a line (bertjax/finetune/graph/data.py: passages, links, label or answer)
      train_file="train.jsonl", eval_file="dev.jsonl",  # file names in DIR
      labels=labels,  # classification: label names in id order, comma-separated
      max_nodes=0,  # passages per graph, padded (a static shape); 0: the widest graph of the data
      max_query_length=64,  # tokens of the question (claim) before each passage (run_squad.py's default)
      graph_loss="code",  # classification: code (CrossEntropyLoss on the aggregated probabilities, as Trainer.py) | nll
      n_best_size=20, max_answer_length=30,  # span: the n-best search in the chosen passage (run_squad.py's)
      max_train_examples=0, max_eval_examples=0,  # graphs; 0: all
  )
  c.xh = dict(
      from_layer=9,  # hops after layers 9..11 of BERT-base (config_hotpot.json gnn_layer 9; model.py: "last three")
      form="gat",  # gat: the released code's graph attention | dot: the paper's dot-product attention
      heads=0,  # 0: the encoder's heads (model.py GraphAttention: 12 heads x 64 = 768)
      isolated="keep",  # a passage nothing links to: keep its [CLS] | merge (the hop with an empty message)
  )
  c.seq_len = 300  # config_hotpot.json bert_max_len
  c.learning_rate, c.epochs = 1e-5, 2.0  # config_hotpot.json training.learning_rate, epochs
  c.batch_size, c.eval_batch_size = 1, 8  # config_hotpot.json train_batch_size: one graph a step
  c.log_every = 100

  if arg.startswith("tiny"):  # the tiny encoder (configs/bert.py:tiny: 2 layers) with a hop after each layer
    c.seeds, c.seq_len, c.batch_size, c.total_steps, c.learning_rate = 1, 32, 8, 30, 1e-3
    c.optimizer.bias_correction = True  # at 1e-3 uncorrected Adam's first steps are ~3x larger (as finetune.py:tiny)
    c.xh.from_layer = 0
    c.log_every, c.eval_batch_size = 10, 16
    c.task.max_query_length = 8
  return c
