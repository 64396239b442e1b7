"""Fine-tuning a pretrained encoder on a sentence or sentence-pair task (the GLUE task shapes).

Recipe (BERT §4.1 / ELECTRA §3.1 and Appendix A): [CLS] pooled by a tanh dense layer, dropout, a linear
classifier (1 output and MSE for regression, STS-B); AdamW, lr in {2,3,5}e-5 for base models (ELECTRA:
1e-4 with layer-wise decay 0.8; large: 5e-5, 0.9), batch 32, 3 epochs (10 for RTE and STS-B with
ELECTRA), 10% warmup, linear decay; several seeds with the median reported.

  python -m bertjax.finetune --config=configs/finetune.py:sst2 --config.init.checkpoint=WORKDIR_OR_HF_DIR \\
      --config.task.source=tsv:/data/glue/SST-2 --workdir=/tmp/ft-sst2
  python -m bertjax.finetune --config=configs/finetune.py:rte --config.task.source=tfds:glue/rte ...
  python -m bertjax.finetune --config=configs/finetune.py:tiny ...     # CPU smoke size

`arg` is a task name (below); the model comes from the checkpoint (its own config.json), never from here.
"""

import ml_collections

# task: (text_a, text_b, label) TSV columns, (a, b) tfds features, labels (None: regression), metrics,
# TSV dev file. TSV columns are header names, or 0-based indexes for GLUE's headerless CoLA.
TASKS = {
    "cola": (("3", "", "1"), ("sentence", ""), ("0", "1"), ("mcc", "accuracy"), "dev.tsv"),
    "sst2": (("sentence", "", "label"), ("sentence", ""), ("0", "1"), ("accuracy",), "dev.tsv"),
    "mrpc": (("#1 String", "#2 String", "Quality"), ("sentence1", "sentence2"), ("0", "1"), ("accuracy", "f1"), "dev.tsv"),
    "qqp": (("question1", "question2", "is_duplicate"), ("question1", "question2"), ("0", "1"), ("accuracy", "f1"), "dev.tsv"),
    "stsb": (("sentence1", "sentence2", "score"), ("sentence1", "sentence2"), None, ("spearman", "pearson"), "dev.tsv"),
    "mnli": (("sentence1", "sentence2", "gold_label"), ("premise", "hypothesis"),
             ("contradiction", "entailment", "neutral"), ("accuracy",), "dev_matched.tsv"),
    "qnli": (("question", "sentence", "label"), ("question", "sentence"), ("entailment", "not_entailment"),
             ("accuracy",), "dev.tsv"),
    "rte": (("sentence1", "sentence2", "label"), ("sentence1", "sentence2"), ("entailment", "not_entailment"),
            ("accuracy",), "dev.tsv"),
}
# tfds label ids follow GLUE's own order, which for MNLI differs from the sorted TSV names above.
TFDS_LABELS = {"mnli": ("entailment", "neutral", "contradiction")}


def get_config(arg: str = "sst2"):
  """`arg`: a GLUE task (cola sst2 mrpc qqp stsb mnli qnli rte), `tiny` (sst2's shape, CPU-sized run),
  squad1 / squad2 (extractive QA), or a token or multiple-choice task (ner chunk pos swag); the presets
  beyond GLUE are in the blocks at the end of this file."""
  if arg in SQUAD_VERSIONS:
    return squad_config(arg)
  if arg in TOKEN_AND_CHOICE_TASKS:
    return token_and_choice_config(arg)
  task = "sst2" if arg == "tiny" else arg
  if task not in TASKS:
    raise ValueError(f"unknown task {arg!r}; use one of {', '.join(TASKS)} or tiny")
  (a, b, label), (tf_a, tf_b), labels, metrics, dev = TASKS[task]
  c = ml_collections.ConfigDict()
  # Run.
  c.seed = 0  # base seed: seed s of `seeds` runs with seed + s (data order, dropout, head init)
  c.seeds = 3  # how many seeds to run; median and mean +- std are reported, as the papers do
  c.batch_size = 32
  c.seq_len = 128  # [CLS] A [SEP] B [SEP], the longer segment truncated first
  c.epochs = 3.0  # used when total_steps is 0
  c.total_steps = 0  # 0: epochs over the training set
  c.warmup_steps = -1  # -1: warmup_fraction of total_steps
  c.warmup_fraction = 0.1
  # How epochs become steps. bert (google-research/bert run_classifier.py): int(epochs * N / batch) full
  # batches from a stream of reshuffled epochs, warmup int(fraction * total). transformers (Trainer):
  # ceil(N / batch) batches an epoch, the last one partial (padded rows weigh 0), warmup ceil(fraction * total).
  c.epoch_mode = "bert"
  # Length buckets (bertjax.finetune.batches): each batch is cut to the smallest bucket holding its longest
  # row (one compiled step per bucket); auto = seq_len / 32 buckets fitted to the training rows' lengths
  # (multiples of 8) and seq_len; a list "32,64,128"; none = every batch padded to seq_len.
  c.bucket_lengths = "auto"
  # Rows are sorted by length within windows of this many shuffled batches, whose batches then run in a
  # seeded random order (transformers' group_by_length uses 50); 0 or 1: no grouping.
  c.length_window = 50
  # Classification: pack several examples into each training row (their own attention groups, positions restarting,
  # a [CLS] gathered per example), so no compute goes to padding (ModernBERT's unpadding, issue #37); eval keeps
  # the length buckets. Off: one example a row, as the references.
  c.pack_train = False
  c.learning_rate = 2e-5  # peak
  c.log_every = 50
  c.eval_every = 0  # 0: evaluate only at the end
  c.eval_batch_size = 64
  c.save_model = False  # write each seed's fine-tuned model to WORKDIR/seed_S/model (what bertjax.compress.prune reads)
  # Every this many steps, save the seed's params and optimizer state to WORKDIR/seed_S/checkpoints; a rerun with
  # the same workdir and recipe resumes there, exactly (batches and dropout are pure functions of (seed, step)), and
  # reuses finished seeds (WORKDIR/seed_S/result.json). 0: no checkpoints, every run starts over.
  c.checkpoint_every = 0
  # Early exit (docs/early_exit.md): a classifier after every layer, trained as the method does, each example
  # leaving at the first layer its rule allows. "" off | deebert (entropy < threshold; two stages) | pabee
  # (threshold = patience, layers agreeing in a row; joint, depth-weighted) | fastbert (normalized entropy <
  # threshold; self-distillation stage) | depth (a per-sequence depth classifier after layer 1; exit at the first
  # depth whose cumulative probability >= threshold). results.json adds mean_exit_layer, flops_saved and the
  # full-depth metrics; seed_S/exit_sweep.json the same over a sweep of thresholds.
  c.early_exit = ""
  c.exit = dict(
      threshold=-1.0,  # < 0: the method's default (deebert 0.3, pabee 3, fastbert 0.5, depth 0.5)
      sweep="",  # thresholds for exit_sweep.json, comma-separated; "": the rule's default list
      delta=0.1,  # pabee on regression: |z_j - z_(j-1)| < delta counts as agreeing
      depth_cost=0.1,  # depth: the oracle argmax_n [log p_n(y|x) - depth_cost * n] (nats per layer)
  )
  # Task.
  c.task = dict(
      kind="classification",  # task family (bertjax.finetune.tasks.KINDS); span and token tasks have their own
      name=task,
      source="",  # tsv:DIR (GLUE layout: DIR/train.tsv, DIR/<eval_file>) | tfds:glue/NAME
      text_a=a, text_b=b, label=label,  # TSV columns (header names, or indexes when header=False)
      tfds_text_a=tf_a, tfds_text_b=tf_b,  # tfds feature names
      header=task != "cola",  # whether the TSVs start with a header row
      eval_file=dev,  # tsv: the file to evaluate on
      extra_eval="mismatched" if task == "mnli" else "",  # further eval splits NAME: tsv dev_NAME.tsv, tfds
      # validation_NAME; their metrics are reported as METRIC_NAME (MNLI: accuracy_mismatched)
      eval_split="validation_matched" if task == "mnli" else "validation",  # tfds
      labels=",".join(labels) if labels else "",  # label names in id order; empty: regression
      tfds_labels=",".join(TFDS_LABELS.get(task, labels or ())),
      metrics=",".join(metrics),  # first one is the headline
      max_train_examples=0,  # 0: all; else a fixed random subset (seeded by `seed`, the same for every seed)
      max_eval_examples=0,
  )
  # Initialization.
  c.init = dict(
      checkpoint="",  # a bertjax workdir (pretraining run or `bertjax.hf import`) or an HF checkpoint dir
      generator_dir="",  # HF ELECTRA: the generator to import alongside (not needed for fine-tuning)
  )
  # Model: the encoder comes from the checkpoint; these override its dropout (-1 keeps it).
  c.model = dict(
      dropout=-1.0,
      attention_dropout=-1.0,
      # Dropout masks' generator (bertjax.model.dropout): auto (lowbias32 on the CPU, threefry elsewhere) |
      # threefry (the reference) | lowbias32; a property of this run, not of the checkpoint.
      dropout_rng="auto",
      classifier_dropout=0.1,  # on the pooled [CLS] vector, before the classifier
      head="auto",  # pooler (BERT: tanh pooler, dropout, linear) | electra (dropout, dense, GELU, dropout,
      # linear: ElectraForSequenceClassification) | roberta (dropout, dense, tanh, dropout, linear on <s>:
      # RobertaForSequenceClassification) | modernbert (pool, dense, GELU, LayerNorm, dropout, linear:
      # ModernBertForSequenceClassification) | distilbert (dense, ReLU, dropout, linear:
      # DistilBertForSequenceClassification) | auto: the checkpoint family's (those four), else pooler
      pooling="auto",  # modernbert head: auto (the checkpoint config.json's classifier_pooling, else cls) | cls (the
      # first token) | mean (of the real tokens): HF's classifier_pooling; cls or mean given here wins. Also what
      # the early-exit heads pool (docs/early_exit.md; not FastBERT's students)
      dtype="float32",  # compute dtype: float32 | bfloat16
      # int8: quantization-aware fine-tuning and int8 evaluation of the encoder's matmuls (qwix: per-channel
      # weights, dynamic per-token activations); q8bert: Zafrir et al. 2019 (per-tensor weights, EMA activation
      # ranges frozen for inference, embeddings, pooler and classifier too; docs/compression.md)
      quantize="",
  )
  # Optimizer (bertjax.train.optim names).
  c.optimizer = dict(
      # schedule: linear (BERT's run_classifier: decay to 0 over all steps) | linear_after_warmup
      # (transformers' get_linear_schedule_with_warmup) | electra | cosine
      name="adamw", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0, schedule="linear",
      # google-research/bert optimization.py AdamWeightDecayOptimizer (run_classifier, run_squad; ELECTRA's
      # fine-tuning uses the same optimizer): no Adam bias correction, no decay on biases and LayerNorm.
      bias_correction=False, decay_mask="bert",
      layerwise_decay=1.0,  # ELECTRA: lr x decay^(depth from the top); 1.0 = off, ELECTRA base 0.8, large 0.9
  )

  if arg == "tiny":  # CPU smoke size: short sequences, few steps, one seed
    c.seeds, c.batch_size, c.seq_len, c.total_steps, c.learning_rate = 1, 32, 64, 200, 1e-3
    c.optimizer.bias_correction = True  # at 1e-3 uncorrected Adam's first steps are ~3x larger (core.config.tiny_on_demo)
    c.log_every, c.eval_batch_size = 50, 128
  return c


# ---------------------------------------------------------------- SQuAD (extractive QA, issue #32)
# python -m bertjax.finetune --config=configs/finetune.py:squad2 --config.init.checkpoint=CKPT \
#     --config.task.source=json:DIR --workdir=W      (DIR/train-v2.0.json, DIR/dev-v2.0.json; docs/squad.md)
SQUAD_VERSIONS = {"squad1": "1.1", "squad2": "2.0"}
SQUAD_FILES = {"squad1": ("train-v1.1.json", "dev-v1.1.json"), "squad2": ("train-v2.0.json", "dev-v2.0.json")}


def squad_config(arg: str):
  """SQuAD v1.1 (`squad1`) or v2.0 (`squad2`): the shared run, init, model and optimizer sections of the
  GLUE config with the BERT paper's SQuAD recipe (§4.2/4.3: lr 5e-5, batch 32 and 3 epochs for v1.1,
  batch 48 and 2 epochs for v2.0; run_squad.py: seq 384, stride 128, question 64, n-best 20, answer 30)."""
  c = get_config("sst2")
  version = SQUAD_VERSIONS[arg]
  c.batch_size, c.epochs = (32, 3.0) if version == "1.1" else (48, 2.0)  # BERT paper §4.2 / §4.3
  c.learning_rate = 5e-5  # BERT paper §4.2 / §4.3
  c.seq_len = 384  # run_squad.py max_seq_length
  c.log_every = 100
  train_file, eval_file = SQUAD_FILES[arg]
  c.task = dict(
      kind="squad",  # bertjax.finetune.squad
      name=arg,
      version=version,  # 1.1: every question answered, exact_match/f1 | 2.0: unanswerable ones, null odds
      source="",  # json:DIR (DIR/train_file, DIR/eval_file) | tfds:squad/v1.1 | tfds:squad/v2.0
      train_file=train_file,  # json: the official names
      eval_file=eval_file,
      eval_split="validation",  # tfds
      doc_stride=128,  # run_squad.py: tokens between window starts
      max_query_length=64,  # run_squad.py: questions are cut to this many tokens
      n_best_size=20,  # run_squad.py: start and end candidates per window, and answers kept in nbest
      max_answer_length=30,  # run_squad.py: tokens
      null_score_diff_threshold=0.0,  # v2.0: answer "" when null odds exceed this (run_squad.py's flag)
      answerable_head=False,  # v2.0: ELECTRA's answerable classifier (its logit becomes the null score)
      max_train_examples=0,  # questions; 0: all, else a fixed random subset (seeded by `seed`)
      max_eval_examples=0,
  )
  return c


# ---------------------------------------------------------------- token classification and multiple choice
# (issue #33; docs/tagging.md). The trainer, model and optimizer sections are the ones above; only the
# task section and the recipe differ.
#
#   python -m bertjax.finetune --config=configs/finetune.py:ner --config.init.checkpoint=CKPT \
#       --config.task.source=conll:DIR --config.task.train_file=train.txt --config.task.eval_file=dev.txt
#   python -m bertjax.finetune --config=configs/finetune.py:swag --config.init.checkpoint=CKPT \
#       --config.task.source=swag:DIR       # SWAG's train.csv / val.csv; or jsonl:DIR

# name: (task kind, CoNLL tag column, tag scheme, tfds tag feature, what it is)
TOKEN_AND_CHOICE_TASKS = {
    "ner": ("tagging", -1, "auto", "ner", "named entities (CoNLL-2003, WNUT-17, WikiANN)"),
    "chunk": ("tagging", -1, "auto", "chunks", "phrase chunks (CoNLL-2000; ELECTRA's tagging task)"),
    "pos": ("tagging", -1, "none", "pos", "part-of-speech tags (no entities: f1 = accuracy)"),
    "swag": ("multiple_choice", 0, "", "", "SWAG (4 endings) or any JSONL multiple choice"),
}


def token_and_choice_config(arg: str):
  """A token-classification (ner, chunk, pos) or multiple-choice (swag) preset."""
  kind, tag_column, scheme, tfds_feature, _ = TOKEN_AND_CHOICE_TASKS[arg]
  c = get_config("sst2")  # the shared run, model and optimizer sections
  c.model.head = "pooler"  # multiple choice: BertForMultipleChoice's pooler head (tagging has no pooler)
  if kind == "tagging":
    c.task = dict(
        kind=kind, name=arg,
        source="",  # conll:DIR (DIR/train_file, DIR/eval_file) | tfds:conll2003
        train_file="train.txt", eval_file="dev.txt",  # conll: file names in DIR
        token_column=0, tag_column=tag_column,  # conll: 0-based columns (negative from the end)
        strip_token_prefix="",  # conll: removed from each token (WikiANN's "en:")
        tag_scheme=scheme,  # auto (detected from the training tags) | iob1 | iob2 | bioes | none (POS)
        label_all_subwords=False,  # also train on later subwords (B- -> I-); scoring reads first subwords only
        window_stride=0,  # subwords between windows over a long sentence; 0: half the window
        tfds_tag_feature=tfds_feature, train_split="train", eval_split="dev",  # tfds (conll2003: train, dev, test)
        max_train_examples=0, max_eval_examples=0,  # sentences; 0: all
    )
    # transformers examples/pytorch/token-classification/run_ner.py, its README's recipe and Trainer's
    # defaults: seq 128, lr 5e-5, 3 epochs, batch 32, linear decay from the start (no warmup), no
    # weight decay, Adam eps 1e-8, clipping at 1.0, epochs counted as Trainer counts them.
    c.seq_len, c.learning_rate, c.epochs, c.batch_size = 128, 5e-5, 3.0, 32
    c.warmup_fraction, c.epoch_mode = 0.0, "transformers"
    c.optimizer.update(weight_decay=0.0, eps=1e-8, schedule="linear_after_warmup")
    # Trainer's torch AdamW: bias-corrected; decay mask: biases and LayerNorm weights excluded (moot at decay 0).
    c.optimizer.update(bias_correction=True, decay_mask="bert")
  else:
    c.task = dict(
        kind=kind, name=arg,
        source="",  # swag:DIR (SWAG's CSV: sent1, sent2, ending0-3, label) | jsonl:DIR ({"context",
        # "question", "choices": [...], "label"} a line)
        train_file="train.csv", eval_file="val.csv",  # file names in DIR (jsonl: e.g. train.jsonl, dev.jsonl)
        max_train_examples=0, max_eval_examples=0,
    )
    # BERT §4.4 (SWAG): lr 2e-5, batch 16, 3 epochs; 10% warmup and the rest of run_classifier's recipe.
    c.seq_len, c.learning_rate, c.epochs, c.batch_size = 128, 2e-5, 3.0, 16
  return c

