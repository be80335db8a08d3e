"""Bookkeeping, no tensors: request state, scheduler, block pool, radix cache, KV cache manager."""
