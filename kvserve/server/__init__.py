"""The OpenAI-compatible API server: protocol models, FastAPI app, parsers, metrics, CLI."""
