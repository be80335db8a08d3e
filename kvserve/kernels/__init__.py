"""GPU kernels (Triton), each beside or naming a plain-torch reference of the same function.

Nothing here imports Triton at package import: import a kernel module directly
(``from kvserve.kernels.rmsnorm import rms_norm``). Kernel modules go through ``_triton``, so their
torch references stay importable on machines without Triton.
"""
