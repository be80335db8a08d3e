"""The Triton kernels a start's passes compile, kept beside Triton's disk cache so that the next
start of the same engine can skip the recording pass (``compile_ahead.recording_compiles``).

With every kernel already cached, the recording pass was the whole cost of compile ahead on a
warm start: an 8B engine was ready in 8.9 s with it against 5.1 s without (H200, s52). A
manifest is named by a signature of what decides which kernels the passes launch: the model's
modules, parameters and buffers (names, shapes, dtypes), the KV pool's geometry and dtype (its
page count aside: free memory decides it), the passes' own settings, the attention backend,
the device's Triton target and multiprocessor count, the ``KVSERVE_*`` and ``TRITON_*``
environment, the versions of torch and Triton, kvserve's kernels' hashes and its Python files
(path, size, modification time). A signature that misses an input costs nothing but speed: a
kernel the manifest lacks compiles at its launch, is counted as such, and the start drops the
manifest (the next start records again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvserve.kernels._triton import sm_count
from kvserve.kernels.compile_ahead import KernelSpec
from kvserve.kernels.kernel_hashes import kvserve_kernels
from kvserve.loader.file_cache import write_json

if TYPE_CHECKING:
    from kvserve.engine.runner.warm_start import StartPasses

_DIR = "kvserve_start_manifests"
_VERSION = 1  # of the file's layout


def _package_files() -> Iterable[str]:
    root = Path(__file__).resolve().parents[2]  # kvserve/
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        yield f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}"


def _model_lines(model: torch.nn.Module) -> Iterable[str]:
    for name, module in model.named_modules():
        yield f"module {name} {type(module).__qualname__}"
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        yield f"tensor {name} {tuple(tensor.shape)} {tensor.dtype}"


def signature_lines(passes: StartPasses, target: list[object]) -> list[str]:
    """What the signature hashes, a line each (readable, so a test can name what changed)."""
    import triton

    geometry = passes.kv.geometry
    environment = sorted(
        f"{key}={value}" for key, value in os.environ.items()
        if key.startswith(("KVSERVE_", "TRITON_"))
    )  # fmt: skip
    settings = (
        passes.context_length, passes.scheduler, passes.graph_max_bs, passes.max_pages,
        passes.hidden_size, passes.dtype, passes.kv.dtype, geometry.num_layers,
        geometry.page_size, geometry.num_kv_heads, geometry.head_dim,
        type(passes.backend).__qualname__, type(passes.prefill).__qualname__,
    )  # fmt: skip
    return [
        f"layout {_VERSION}",
        f"versions torch {torch.__version__} triton {triton.__version__} target {target}",
        # kernel configs follow the SM count (the GEMV's tiles), which the target does not name
        f"multiprocessors {sm_count(passes.device)}",
        f"passes {settings!r}",
        f"backend {_plain_attributes(passes.backend)!r}",
        *environment,
        *(
            f"kernel {kernel.__module__}.{kernel.__name__} {kernel.cache_key}"
            for kernel in kvserve_kernels()
        ),  # fmt: skip
        *_package_files(),
        *_model_lines(passes.model),
    ]


def _plain_attributes(obj: object) -> list[tuple[str, Any]]:
    """An object's public attributes that print alike in every process (a backend's
    dependent-launch switch, say), by name. Objects and tensors are left out, and so are
    private attributes: cuDNN's handle, an int, is an address that differs every start."""
    plain = (str, int, float, bool, type(None), torch.dtype)
    attributes = getattr(obj, "__dict__", {}).items()
    return sorted((k, v) for k, v in attributes if not k.startswith("_") and isinstance(v, plain))


class StartManifest:
    """The kernel list of one start signature, in Triton's cache directory."""

    def __init__(self, signature: str, cache_dir: str | None = None) -> None:
        from triton import knobs

        root = Path(cache_dir if cache_dir is not None else knobs.cache.dir)
        self.path = root / _DIR / f"{signature}.json"

    @classmethod
    def of(cls, passes: StartPasses, target: list[object]) -> StartManifest:
        lines = "\n".join(signature_lines(passes, target))
        return cls(hashlib.sha256(lines.encode("utf-8")).hexdigest())

    def load(self) -> list[KernelSpec] | None:
        """The kernels a start of this signature recorded; None if none was kept or it is
        unreadable."""
        try:
            data = json.loads(self.path.read_text())
            return [KernelSpec(s["module"], s["name"], s["specialization"]) for s in data]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, specs: list[KernelSpec]) -> None:
        """Kept atomically (other starts may read it meanwhile); a failure to write is
        ignored: the next start records again."""
        data = [{"module": s.module, "name": s.name, "specialization": s.specialization}
                for s in specs]  # fmt: skip
        with contextlib.suppress(OSError):
            write_json(self.path, data)

    def forget(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
