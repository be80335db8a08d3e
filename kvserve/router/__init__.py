"""`kvserve route`: an OpenAI-compatible HTTP router in front of N kvserve (or any OpenAI) workers.

One small module per concept: config (flags as data), worker + registry + worker_file (who can
serve), policies/ (who serves this request), health + breaker (who is fit), admission (bounded
queue), upstream + proxy (forwarding, retries, streaming), metrics, app (HTTP), cli."""
