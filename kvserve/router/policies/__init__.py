"""Routing policies: which worker (or which prefill + decode pair) serves a request."""
