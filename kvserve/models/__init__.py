"""Model families, looked up by HF `architectures` name (see ``registry.py``)."""
