"""`kvserve bench`: cache-aware load generator for OpenAI-compatible servers.

Flow: profile (what to send) -> arrivals (when) -> streaming client -> per-request records ->
metrics -> printed block, result.json, plots, HTML report. WORKLOADS.md is the specification.
"""
