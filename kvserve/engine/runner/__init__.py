"""Tensors: model runner, input batch, CUDA graphs, sampling batch, launched step, KV memory."""
