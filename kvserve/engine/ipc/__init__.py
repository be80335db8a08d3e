"""The process boundary: the engine-core process, its client, and the typed messages."""
