"""Engine: ``core/`` (bookkeeping), ``runner/`` (tensors), ``ipc/`` (process boundary), and
the engine step (``engine_core``) with its front ends (offline ``LLM``, output processor,
detokenizer)."""
