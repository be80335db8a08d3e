"""Quantization: the registry of schemes kvserve runs (``registry``), checkpoint
``quantization_config`` readers (``checkpoint_config``), the linear-method protocol
(``method``) and one package per format. See ``registry`` for how a format plugs in."""
