"""The transformers reference model for benchmarks (HF dir or GGUF file)."""

from __future__ import annotations

import os

import torch


def reference_model(path: str, dtype: str = "float32"):  # noqa: ANN201 - a transformers model
    import transformers

    kwargs = {"dtype": getattr(torch, dtype)}
    if path.endswith(".gguf"):
        path, kwargs["gguf_file"] = os.path.split(path)
    return transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
