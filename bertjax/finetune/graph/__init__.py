"""The graph family (Transformer-XH: graphs of linked passages): `task` (graph classification; the trainer's calls),
`span` (span extraction over a graph), `data` (the JSONL reader and passage rows), `model` (GraphModel over
bertjax.model.xh's extra hop) and `hf` (saved models). Its `family` module registers it with the trainer."""
