"""Tensors: the KV pool, model runner, input batch, CUDA graphs, sampling batch, launched step."""
