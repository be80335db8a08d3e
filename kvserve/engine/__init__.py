"""Engine: request state, scheduler, KV cache manager, model runner, engine core, offline API."""
