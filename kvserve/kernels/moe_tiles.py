"""The tiles the experts' GEMMs run at (the grouped GEMMs; the word GEMV of FP4 decode steps):
tuned per GPU, expert shape, format and token count where ``moe_configs/<GPU name>.json`` has
them, else the caller's heuristic tile.

A table is written by ``python -m benchmarks.moe_tune`` on the GPU it names, which times the
same kernels the engine launches over a grid of tiles and keeps the fastest gate/up and down
pair (one ``BLOCK_M``: the slots are sorted once for both GEMMs). A step takes the entry of the
tuned token count nearest its own (in log scale). ``KVSERVE_MOE_TUNED=0`` ignores the tables
(A/B runs). ``KVSERVE_MOE_CONFIG_DIR``: a directory whose ``<GPU name>.json`` is read instead of
the shipped one where it has one (a table tuned on the node, or one side of an engine A/B).

Table layout::

    {"device": "NVIDIA H200",
     "produced_by": [{"command": "python -m benchmarks.moe_tune ...", "commit": ..., "date": ...}],
     "shapes": {"<MoeShape.key()>": {"<tokens>": {"gate_up": {tile}, "down": {tile}}}}}

where a tile is ``{"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}``, or for a
``*_gemv`` kind ``{"block_n", "block_w", "split_k", "num_warps", "num_stages"}``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.config import env_switch

if TYPE_CHECKING:  # torch is imported where a GPU is asked: preflight reads tables without it
    import torch

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
GEMV_KEYS = ("block_n", "block_w", "split_k", "num_warps", "num_stages")
TABLE_DIR = Path(__file__).parent / "moe_configs"
TUNED_ENV = "KVSERVE_MOE_TUNED"
CONFIG_DIR_ENV = "KVSERVE_MOE_CONFIG_DIR"
log = logging.getLogger("kvserve.kernels")


@dataclass(frozen=True)
class MoeShape:
    """What a tuned tile depends on besides the token count. ``kind``: the weights' format as
    the kernel sees it (``bfloat16``, ``fp8_block128x128``, ``fp8_channel``, ``nvfp4``,
    ``mxfp4``; ``nvfp4_gemv``, ``mxfp4_gemv`` for decode steps on the word GEMV); ``n``, ``k``:
    the gate/up stack's rows and columns (2 x the intermediate size of a shard, the hidden
    size)."""

    kind: str
    experts: int
    n: int
    k: int
    top_k: int

    def dims(self) -> str:
        return f"E={self.experts} N={self.n} K={self.k} top_k={self.top_k}"

    def key(self) -> str:
        return f"{self.kind} {self.dims()}"


@dataclass(frozen=True)
class MoeTiles:
    """One tile for each GEMM. Grouped-GEMM tiles (``TILE_KEYS``) share ``BLOCK_M``, the block
    the slots are sorted into. Kinds ending in ``_gemv`` (FP4 decode steps on the word GEMV)
    hold ``word_gemv.GemvConfig`` fields (``GEMV_KEYS``), or nothing: the GEMV's own default."""

    gate_up: dict[str, int]
    down: dict[str, int]

    def __post_init__(self) -> None:
        if self.gate_up.get("BLOCK_M") != self.down.get("BLOCK_M"):
            raise ValueError(f"gate/up and down tiles differ in BLOCK_M: {self}")

    @property
    def block_m(self) -> int:
        """The sort block (a GEMV step is not sorted: any value)."""
        return self.gate_up.get("BLOCK_M", 16)


def _checked_tiles(kind: str, entry: dict) -> MoeTiles:
    keys = sorted(GEMV_KEYS if kind.endswith("_gemv") else TILE_KEYS)
    for tile in (entry["gate_up"], entry["down"]):
        default = not tile and kind.endswith("_gemv")
        if not default and (
            sorted(tile) != keys or not all(isinstance(v, int) and v > 0 for v in tile.values())
        ):
            raise ValueError(f"a {kind} tile has exactly {keys}, positive ints: {tile}")
    return MoeTiles(entry["gate_up"], entry["down"])


def table_path(device_name: str) -> Path:
    """The shipped table of this GPU."""
    return TABLE_DIR / f"{device_name.replace(' ', '_')}.json"


@functools.cache  # read once, like KVSERVE_MOE_TUNED; reload_tables forgets it
def _config_dir() -> Path | None:
    """``KVSERVE_MOE_CONFIG_DIR``, when it names a directory (else a warning, once)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    if not override:
        return None
    if not Path(override).is_dir():
        log.warning("MoE tiles: %s=%s is not a directory; the shipped table is read",
                    CONFIG_DIR_ENV, override)  # fmt: skip
        return None
    return Path(override)


def active_table_path(device_name: str) -> Path:
    """The table the kernels read: ``KVSERVE_MOE_CONFIG_DIR``'s for this GPU if it has one,
    else the shipped one."""
    shipped = table_path(device_name)
    override = _config_dir()
    if override is not None and (override / shipped.name).exists():
        return override / shipped.name
    return shipped


@functools.cache
def load_table(device_name: str) -> dict[str, dict[int, MoeTiles]]:
    """{shape key: {tokens: tiles}} for one GPU, empty when none was tuned for it."""
    path = active_table_path(device_name)
    if not path.exists():
        return {}
    try:
        shapes = json.loads(path.read_text())["shapes"]
        table = {
            key: {int(t): _checked_tiles(key.split()[0], e) for t, e in entries.items()}
            for key, entries in shapes.items()
        }
        if any(t < 1 for entries in table.values() for t in entries):
            raise ValueError("token counts are positive")
        return table
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a MoE tile table ({e})") from e


@functools.lru_cache(maxsize=4096)  # every MoE layer of an eager step asks (3 us uncached)
def tuned_tiles(shape: MoeShape, tokens: int, device_name: str) -> MoeTiles | None:
    entries = load_table(device_name).get(shape.key())
    if not entries:
        return None
    nearest = min(entries, key=lambda t: (abs(math.log2(t) - math.log2(max(tokens, 1))), t))
    return entries[nearest]


def tuned_kinds(device_name: str, shape: MoeShape) -> list[str]:
    """The formats this GPU's table tunes at ``shape``'s dimensions (its kind aside)."""
    return sorted(key.split(" ", 1)[0] for key in load_table(device_name)
                  if key.split(" ", 1)[1] == shape.dims())  # fmt: skip


def reload_tables() -> None:
    """Forget the tables read so far, ``KVSERVE_MOE_TUNED`` and ``KVSERVE_MOE_CONFIG_DIR``
    (tests that set their own)."""
    load_table.cache_clear()
    tuned_tiles.cache_clear()
    _tables_on.cache_clear()
    _config_dir.cache_clear()


@functools.cache  # read once: every MoE layer of an eager step asks
def _tables_on() -> bool:
    """``KVSERVE_MOE_TUNED``: 1 (the default) reads the tuned tile tables, 0 ignores them."""
    return env_switch(TUNED_ENV, default=True)


@functools.cache
def _device_name(index: int | None) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def moe_tiles(
    shape: MoeShape, tokens: int, device: torch.device, fallback: dict[str, int]
) -> MoeTiles:
    """The tuned tiles for this GPU and shape, else ``fallback`` for both GEMMs."""
    if device.type == "cuda" and _tables_on():
        name = _device_name(device.index)
        tiles = tuned_tiles(shape, tokens, name)
        if tiles is not None:
            return tiles
        _note_untuned(shape, name)
    return MoeTiles(fallback, fallback)


def expert_tiles(
    kind: str, stack_shape: tuple[int, int, int], topk_ids: torch.Tensor, device: torch.device,
    fallback: dict[str, int], shared: bool = False,
) -> MoeTiles:  # fmt: skip
    """``moe_tiles`` for a step routed as ``topk_ids`` [T, k] through experts whose gate/up
    stack is ``stack_shape`` [E, N, K]. A stacked shared expert (``shared``: expert E - 1 and
    each token's last slot, ``kvserve.layers.moe``) takes the entry of the routed experts,
    E - 1 of them and k - 1 slots a token: the tables are tuned on the model's routed shape."""
    experts, n, k = stack_shape
    key = MoeShape(kind, experts - shared, n, k, topk_ids.shape[1] - shared)
    return moe_tiles(key, topk_ids.shape[0], device, fallback)


@functools.cache
def _note_untuned(shape: MoeShape, device_name: str) -> None:
    log.warning(
        "MoE tiles: no tuned entry for %s on %s in %s; heuristic tiles (tune with "
        "python -m benchmarks.moe_tune)", shape.key(), device_name, active_table_path(device_name),
    )  # fmt: skip
