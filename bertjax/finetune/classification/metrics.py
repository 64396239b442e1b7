"""GLUE's task metrics on host arrays: accuracy, F1 (positive class 1), Matthews corr., Pearson, Spearman."""

import numpy as np
import scipy.stats


def accuracy(pred, label) -> float:
  return float(np.mean(pred == label))


def f1(pred, label) -> float:
  """Binary F1 of class 1 (MRPC, QQP): 0 when nothing is predicted or present."""
  tp = float(np.sum((pred == 1) & (label == 1)))
  fp, fn = float(np.sum((pred == 1) & (label != 1))), float(np.sum((pred != 1) & (label == 1)))
  return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def mcc(pred, label) -> float:
  """Matthews correlation of binary predictions (CoLA); 0 when a margin is empty."""
  tp = float(np.sum((pred == 1) & (label == 1)))
  tn = float(np.sum((pred == 0) & (label == 0)))
  fp, fn = float(np.sum((pred == 1) & (label == 0))), float(np.sum((pred == 0) & (label == 1)))
  den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return float((tp * tn - fp * fn) / den) if den else 0.0


def pearson(pred, label) -> float:
  return float(scipy.stats.pearsonr(pred, label)[0]) if np.std(pred) > 0 else 0.0


def spearman(pred, label) -> float:
  return float(scipy.stats.spearmanr(pred, label)[0]) if np.std(pred) > 0 else 0.0


REGISTRY = {"accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}


def compute(names, outputs, labels) -> dict:
  """name -> value for model outputs [N, C] (C = 1: regression scores, else class logits)."""
  pred = outputs[:, 0] if outputs.shape[1] == 1 else outputs.argmax(-1)
  return {name: REGISTRY[name](pred, labels) for name in names}
