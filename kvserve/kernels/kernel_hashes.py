"""Every Triton kernel of ``kvserve.kernels``, and their hashes settled in one order, so that
the engine and compile ahead's worker processes name a kernel's disk-cache files alike."""

from __future__ import annotations

import functools


@functools.cache
def kvserve_kernels() -> tuple:
    """Every Triton kernel of ``kvserve.kernels`` (helpers too), by module, then name."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import kvserve.kernels as package

    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for _, value in sorted(vars(module).items()):
            if isinstance(value, JITFunction) and value.__module__ == module.__name__:
                found.append(value)
    return tuple(found)


def settle_kernel_hashes() -> None:
    """Hashes every kvserve kernel in one order (``kvserve_kernels``'). Triton (3.6) takes into
    a kernel's hash the constexpr globals of the helpers it calls only if their hashes were
    taken first (``DependenciesFinder._update_hash`` reads ``used_global_vals`` before computing
    ``cache_key``), so a kernel's name in the disk cache depends on which kernels the process
    hashed before it: 10 of kvserve's 110 differ between two orders. The engine and each worker
    settle them alike before either compiles, so that the workers' files are the ones the
    engine looks for."""
    for kernel in kvserve_kernels():
        kernel.cache_key  # noqa: B018 - computed and kept by Triton
