"""GPU kernels (Triton), each beside the one plain-torch reference of the same op (``*_reference``),
which the CPU layers run and the kernel tests compare against. ``options.KernelOptions`` says
which a model runs.

Nothing here imports Triton at package import: import a kernel module directly
(``from kvserve.kernels.rmsnorm import rms_norm``). Kernel modules go through ``_triton``, so their
torch references stay importable on machines without Triton.
"""
