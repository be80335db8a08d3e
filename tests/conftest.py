from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def bundled_path() -> str:
    from model_factory import bundled_gguf_path

    return bundled_gguf_path()


@pytest.fixture(scope="session")
def bundled_llm():  # noqa: ANN201 - kvserve.LLM, imported lazily
    """The bundled SmolLM2 on the offline API, loaded once per session (float32, CPU)."""
    from kvserve import LLM

    return LLM(device="cpu")


@pytest.fixture(scope="session")
def bundled_llm_overlap():  # noqa: ANN201
    """The same with overlap scheduling forced on (a GPU's default), so CI covers its
    bookkeeping: one step stays in flight while the next is planned."""
    from kvserve import LLM

    return LLM(device="cpu", overlap_schedule=True)


@pytest.fixture(scope="session")
def bundled_reference(bundled_path: str):  # noqa: ANN201 - a transformers model
    from model_factory import load_reference_model

    return load_reference_model(bundled_path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """``tiny_model_dir(arch, **overrides)``: a tiny random HF model saved once per variant."""
    from model_factory import make_tiny_model

    made: dict[tuple, object] = {}

    def build(arch: str, **overrides: object):  # noqa: ANN202
        key = (arch, tuple(sorted(overrides.items(), key=lambda kv: kv[0])))
        if key not in made:
            name = "-".join([arch, *(f"{k}={v}" for k, v in key[1])])
            made[key] = make_tiny_model(arch, tmp_path_factory.mktemp(name[:60]), **overrides)
        return made[key]

    return build


@pytest.fixture
def moe_table_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory that ``kvserve.kernels.moe_tiles`` reads its tile tables from."""
    from kvserve.kernels import moe_tiles

    monkeypatch.setattr(moe_tiles, "TABLE_DIR", tmp_path)
    moe_tiles.reload_tables()
    yield tmp_path
    moe_tiles.reload_tables()
