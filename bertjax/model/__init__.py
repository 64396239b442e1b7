"""Model: the BERT-family encoder, its heads and the pretraining model that ties them together."""
