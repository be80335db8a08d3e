"""A worker process of ``compile_ahead``: compiles recorded Triton kernels into Triton's disk
cache, one per line of its standard input, and answers each with a line of its own.

Run as ``python -m kvserve.kernels.compile_worker``. An input line is a JSON object with the
kernel's ``module``, its ``name`` there, Triton's ``specialization`` JSON (what its compile hook
passes: signature, constexprs, attributes, options) and the ``target`` (backend, arch, warp
size); the answer is ``{"error": null | "<one line>", "seconds": <the compile's>}``. The
worker never touches the GPU: it compiles for the target it is given, as Triton does on a
machine without one.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from typing import Any, TextIO


def _tuples(value: Any) -> Any:  # noqa: ANN401 - JSON values of any kind
    """JSON's lists back to the tuples Triton wrote (its signatures and options hold tuples)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _constexpr(value: Any) -> Any:  # noqa: ANN401
    """A constexpr as Triton serializes it: a dtype by name, a ``{"constexpr": v}``, or plain."""
    import triton.language as tl

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(value["constexpr"])
    return value


def _kernel(module: str, name: str) -> Any:  # noqa: ANN401 - a triton.JITFunction
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _source(module: str, name: str, specialization: str) -> tuple[Any, dict[str, Any]]:
    """The kernel's Triton source and compile options, as its launch built them: a Gluon
    kernel's source is a ``GluonASTSource`` (a plain ``ASTSource`` cannot parse it)."""
    from triton.compiler import ASTSource

    kernel = _kernel(module, name)
    source_type = ASTSource
    with contextlib.suppress(ImportError):  # a Triton without Gluon has no Gluon kernels
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

        if isinstance(kernel, GluonJITFunction):
            source_type = GluonASTSource
    data = json.loads(specialization)
    constexprs = {
        tuple(key): _constexpr(value)
        for key, value in zip(data["constant_keys"], data["constant_vals"], strict=True)
    }
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    signature = {key: _tuples(value) for key, value in data["signature"].items()}
    options = {key: _tuples(value) for key, value in data["options"].items()}
    return source_type(kernel, signature, constexprs, attrs), options


def compile_spec(module: str, name: str, specialization: str, target: list[Any]) -> None:
    """Compiles one kernel as its first launch would have, writing Triton's disk cache."""
    import triton
    from triton.backends.compiler import GPUTarget

    src, options = _source(module, name, specialization)
    triton.compile(src, target=GPUTarget(*target), options=options)


def in_disk_cache(module: str, name: str, specialization: str, target: list[Any]) -> bool:
    """Whether ``triton.compile`` would find this kernel in Triton's disk cache: its own
    cache-hit test (Triton 3.6's ``compile``, up to its metadata lookup), loading nothing."""
    import hashlib

    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import (
        get_cache_invalidating_env_vars,
        get_cache_key,
        get_cache_manager,
        make_backend,
    )

    src, options = _source(module, name, specialization)
    backend = make_backend(GPUTarget(*target))
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
    manager = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
    metadata = f"{src.name[:150]}.json"
    return (manager.get_group(metadata) or {}).get(metadata) is not None


def _answers() -> TextIO:
    """The protocol's own copy of standard output; file descriptor 1 then goes to standard
    error, so that whatever a library prints (from Python or C) cannot garble an answer."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return answers


def main() -> None:
    from kvserve.kernels.kernel_hashes import settle_kernel_hashes

    answers = _answers()
    settle_kernel_hashes()  # as the engine did: the same hashes, so the same cache files
    for line in sys.stdin:
        job = json.loads(line)
        error, start = None, time.perf_counter()
        try:
            compile_spec(job["module"], job["name"], job["specialization"], job["target"])
        except Exception as exc:  # noqa: BLE001 - reported; the kernel compiles at its launch
            error = f"{job['module']}.{job['name']}: {type(exc).__name__}: {exc}".splitlines()[0]
        reply = {"error": error, "seconds": time.perf_counter() - start}
        print(json.dumps(reply), file=answers, flush=True)


if __name__ == "__main__":
    main()
