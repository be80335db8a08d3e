"""Tunes the tiles of the experts' grouped GEMMs per expert shape, format and token count, and
writes the table kvserve reads (``kvserve/kernels/moe_configs/<GPU name>.json``, see
``kvserve/kernels/moe_tiles.py``).

    python -m benchmarks.moe_tune --models qwen3-30b-a3b,glm-4.5-air \
        --formats bf16,fp8,nvfp4,mxfp4 [--tokens 1,2,4,...,8192] [--tp 1] [--workers 12] \
        [--table DIR] [--out-dir DIR]

Formats: ``bf16``, ``fp8`` (128 x 128 weight blocks, as Qwen3-FP8 ships), ``fp8-channel``
(per-channel weight scales), ``nvfp4``, ``mxfp4``. For each model's experts
(``benchmarks/configs/<model>/config.json``, the intermediate size split ``--tp`` ways as tensor
parallelism shards it), format and token count, random tokens are routed by a softmax top-k of
random logits, plus a last slot on a stacked shared expert where the engine stacks one
(GLM-4.5-Air: 9 slots a token over 129 experts; the table entry keeps the routed shape, E = 128
and top_k = 8; ``moe_gemm.stacked``). The kernels the engine launches for that step are screened
over a grid of tiles (``step_candidates``): the format's grouped GEMM on the slots sorted or one
to a block, as ``fused_moe`` runs it, gate/up and down apart but sharing ``BLOCK_M``; for FP4
decode steps the word GEMV (``*_gemv`` entries), and for FP8 / bf16 ones with
``KVSERVE_FP8_MOE_GEMV=1`` / ``KVSERVE_BF16_MOE_GEMV=1``. A tile whose output strays from the
heuristic tile's is dropped.
The ``FINALISTS`` best of each GEMM and group are then timed again against the heuristic tile,
interleaved (``retime``), and the fastest pair is kept, the heuristic's unless beaten. Every
timing is of launches replayed from a CUDA graph under programmatic dependent launch, as the
engine's decode steps run, over ``ROUTINGS`` routings at decode sizes (``StepCase.ms``). Until
2026-12-03 it was Triton's ``do_bench`` of one launch after an L2 flush, which at decode sizes
timed something else: Qwen3-30B-A3B's NVFP4 GEMV at one token (heuristic tile, gate/up + down)
took 29.7 + 26.8 us that way and 10.3 + 7.6 us this way (on two H200s), where bf16's gate/up,
14.8 us here, takes 15.0 us in the engine's profile (moe_tune_h200_s38_gemv,
moe_tune_h200_s39_graph). Even so, a kernel timed alone does not rank decode tiles as the engine
does: of this timing's 1-2 token entries, the engine ran GLM-4.5-Air's NVFP4 GEMV 4.7% faster at
batch 1 but Qwen3-30B-A3B's bf16 tiles 4.9% slower (moe_decode_h200_s39_ab_*), so decode entries
go into the shipped table after an engine A/B (``moe_decode`` with each table in place). FP4 steps
whose experts are dequantized are skipped (``bf16`` tunes their kernel). ``--workers`` compiles
the tiles in that many processes first (Triton's disk cache), then one process times them: the
compile is most of the cost.

Writes ``moe_tune_<tag>_<date>.json`` (every step: the screened and retimed tiles) and merges
the kept tiles into the table after each step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import captured_ms, git_commit, write_result
from benchmarks.moe_gemm import Routed, random_fp4_stack, stacked
from benchmarks.moe_tune_space import (
    FP8_BLOCK,
    TOKENS,
    Step,
    heuristic_tile,
    num_sms,
    on_gemv,
    shape_key,
    step_candidates,
    tuned_steps,
)
from kvserve.kernels._triton import hopper_or_newer
from kvserve.kernels.fused_moe import (
    ExpertGemm,
    TokenSum,
    expert_gemm,
    one_slot_per_block,
    slot_blocks,
)
from kvserve.kernels.fused_moe_fp4 import fp4_expert_gemm, fp4_path
from kvserve.kernels.fused_moe_fp8 import fp8_expert_gemm
from kvserve.kernels.fused_moe_half_gemv import half_expert_gemv
from kvserve.kernels.moe_tiles import TABLE_DIR, table_path

GEMMS = ("gate_up", "down")
FINALISTS = 2  # screened tiles of each GEMM and BLOCK_M timed again against the heuristic's
ROUNDS = 3
# A decode-sized step is timed over this many routings of its tokens, one after another in one
# CUDA graph, so the experts one launch reads are not the ones the launch before read (in the
# engine the next launch is another layer's). From DECODE_MAX_TOKENS up, a step reads most
# experts and runs long against a launch: one routing.
ROUTINGS = 8
DECODE_MAX_TOKENS = 64


def routings_for(tokens: int) -> int:
    return ROUTINGS if tokens <= DECODE_MAX_TOKENS else 1


class Experts:
    """One model's experts in one format (random weights); ``gemm(slots)`` is the engine's
    ``ExpertGemm`` over them for a step of that many slots."""

    def __init__(self, fmt: str, shape: dict[str, int]) -> None:
        (_, e), h, inter = stacked(shape), shape["hidden"], shape["inter"]
        self.fmt, self.experts = fmt, e
        if fmt == "bf16":
            self.stacks: tuple[Any, Any] = (
                torch.randn(e, 2 * inter, h, dtype=torch.bfloat16, device="cuda") / h**0.5,
                torch.randn(e, h, inter, dtype=torch.bfloat16, device="cuda") / inter**0.5,
            )
        elif fmt.startswith("fp8"):
            self.block = FP8_BLOCK if fmt == "fp8" else None
            self.stacks = (
                self._fp8(e, 2 * inter, h, self.block),
                self._fp8(e, h, inter, self.block),
            )
        else:
            self.stacks = (
                random_fp4_stack(fmt, e, 2 * inter, h),
                random_fp4_stack(fmt, e, h, inter),
            )

    @staticmethod
    def _fp8(e: int, n: int, k: int, block: tuple[int, int] | None,
             ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        w = torch.randn(e, n, k, device="cuda").clamp_(-448, 448).to(torch.float8_e4m3fn)
        scale_shape = (e, n // block[0], k // block[1]) if block else (e, n)
        return w, torch.rand(scale_shape, device="cuda") / (8 * k**0.5)

    def gemm(self, slots: int) -> ExpertGemm:
        """With programmatic dependent launch where the engine uses it (sm_90+)."""
        pdl = hopper_or_newer(torch.device("cuda"))
        if self.fmt == "bf16":
            if on_gemv(self.fmt, slots, self.experts):
                return half_expert_gemv(*self.stacks, pdl=pdl)
            return expert_gemm(*self.stacks, pdl=pdl)
        if self.fmt.startswith("fp8"):
            gemv = on_gemv(self.fmt, slots, self.experts)
            return fp8_expert_gemm(*self.stacks[0], *self.stacks[1], self.block, pdl, gemv)
        return fp4_expert_gemm(*self.stacks, fp4_path(slots, self.experts), pdl=pdl)


class StepCase:
    """One step's inputs, ``routings`` times over: routed tokens, the down GEMM's input rows,
    and per BLOCK_M the blocks. ``gemm(which, tile)`` runs one GEMM on the first routing as
    ``fused_moe_with`` would; ``cycle(which, tile)`` runs it on each routing in turn."""

    def __init__(self, experts: Experts, shape: dict[str, int], tokens: int, routings: int = 1,
                 ) -> None:  # fmt: skip
        self.routes = [Routed(shape, tokens) for _ in range(routings)]
        self.r = self.routes[0]
        self.hidden = [
            torch.randn(r.slots, shape["inter"], dtype=torch.bfloat16, device="cuda")
            for r in self.routes
        ]
        self.expert_gemm = experts.gemm(self.r.slots)
        self._blocks: dict[tuple[int, int], Any] = {}

    def gemm(self, which: int, tile: dict[str, int], route: int = 0,
             ) -> Callable[[], torch.Tensor]:  # fmt: skip
        r, m = self.routes[route], tile.get("BLOCK_M", 16)
        if (route, m) not in self._blocks:
            self._blocks[(route, m)] = slot_blocks(r.ids, r.experts, m)
        blocks = self._blocks[(route, m)]
        one_slot = isinstance(blocks, torch.Tensor)
        a, rw = (r.x, None) if which == 0 else (self.hidden[route], r.flat_weights)
        token_sum = TokenSum() if which == 1 and one_slot else None
        gemm = self.expert_gemm
        return lambda: gemm(a, which, blocks, r.slots, r.top_k, tile, rw, token_sum)

    def cycle(self, which: int, tile: dict[str, int]) -> Callable[[], None]:
        runs = [self.gemm(which, tile, route) for route in range(len(self.routes))]

        def run_all() -> None:
            for run in runs:
                run()

        return run_all

    def ms(self, which: int, tile: dict[str, int]) -> float:
        """One launch's time: the median replay of a CUDA graph of ``cycle`` (launches back to
        back under the engine's dependent launch; no host launch time, L2 not flushed) over
        the routings."""
        return captured_ms(self.cycle(which, tile)) / len(self.routes)


Task = tuple[Step, dict[str, int], int, dict[str, int]]  # step, shape, 0 gate/up or 1 down, tile


def warm(tasks: list[Task]) -> None:
    """Compiles each task's kernel by running it once (a worker process)."""
    experts: dict[str, Experts] = {}
    cases: dict[Step, StepCase] = {}
    for step, shape, which, tile in tasks:
        if step.fmt not in experts:
            experts[step.fmt] = Experts(step.fmt, shape)
        if step not in cases:
            cases[step] = StepCase(experts[step.fmt], shape, step.tokens)
        with contextlib.suppress(Exception):  # timed, and reported, by the main process
            cases[step].gemm(which, tile)()
    torch.cuda.synchronize()


def warm_in_workers(steps: list[tuple[Step, dict[str, int]]], workers: int) -> None:
    """Each kernel variant once, whatever the model (the shapes do not change the compiled
    code): the first step of each (format, one slot a block, slots a multiple of 16)."""
    tasks: dict[tuple, Task] = {}
    for step, shape in steps:
        per_token, experts = stacked(shape)
        slots = step.tokens * per_token
        variant = (step.fmt, one_slot_per_block(slots, experts), slots % 16 == 0)
        for per_gemm in step_candidates(step, shape, num_sms()).values():
            for which, tile in ((w, t) for w in (0, 1) for t in per_gemm[w]):
                key = (*variant, which, tuple(tile.items()))
                tasks.setdefault(key, (step, shape, which, tile))
    ordered = list(tasks.values())
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(warm, [ordered[i::workers] for i in range(workers)])


def time_tiles(case: StepCase, which: int, tiles: list[dict[str, int]], ref: torch.Tensor,
               ) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for tile in tiles:
        try:
            run = case.gemm(which, tile)
            err = float((run().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            rows.append({"tile": tile, "ms": case.ms(which, tile), "rel_err": err})
        except Exception as e:  # noqa: BLE001 - out of resources and the like
            rows.append({"tile": tile, "error": f"{type(e).__name__}: {str(e)[:120]}"})
    return rows


def tile_name(tile: dict[str, int]) -> str:
    """BLOCK_M/BLOCK_N/BLOCK_K/warps/stages, or block_n/block_w/split_k/warps/stages"""
    return "/".join(str(v) for v in tile.values()) or "default"


def retime(case: StepCase, contenders: list[tuple[int, dict[str, int]]]) -> list[float]:
    """Medians of ``ROUNDS`` interleaved timings, so the finalists are compared in one stretch:
    in a sweep without this round one tile timed 8% apart at its start and its end (Qwen3 bf16,
    4K tokens, moe_tune on the H200), more than the tiles' differences."""
    times: list[list[float]] = [[] for _ in contenders]
    for _ in range(ROUNDS):
        for i, (which, tile) in enumerate(contenders):
            times[i].append(case.ms(which, tile))
    return [statistics.median(t) for t in times]


def tune_step(step: Step, shape: dict[str, int], experts: Experts) -> dict[str, Any]:
    """Screens every candidate, then times the heuristic tile and the ``FINALISTS`` best of each
    GEMM and BLOCK_M again, interleaved; keeps the fastest pair, the heuristic's unless beaten."""
    case = StepCase(experts, shape, step.tokens, routings_for(step.tokens))
    r = case.r
    heuristic = heuristic_tile(step.fmt, r.slots, r.experts)
    refs = [case.gemm(which, heuristic)().float() for which in (0, 1)]
    screened: dict[str, list[dict[str, Any]]] = {"gate_up": [], "down": []}
    contenders = [(0, heuristic), (1, heuristic)]
    for per_gemm in step_candidates(step, shape, num_sms()).values():
        for which, name in enumerate(GEMMS):
            rows = time_tiles(case, which, per_gemm[which], refs[which])
            screened[name] += rows
            good = sorted((row for row in rows if "ms" in row and row["rel_err"] < 2e-2),
                          key=lambda row: row["ms"])  # fmt: skip
            contenders += [(which, row["tile"]) for row in good[:FINALISTS]
                           if row["tile"] != heuristic]  # fmt: skip
    times = retime(case, contenders)
    final = [{"gemm": GEMMS[which], "tile": tile, "ms": ms}
             for (which, tile), ms in zip(contenders, times, strict=True)]  # fmt: skip
    pairs = []
    for m in {row["tile"].get("BLOCK_M", 0) for row in final}:
        in_group = [row for row in final if row["tile"].get("BLOCK_M", 0) == m]
        best = [min((row for row in in_group if row["gemm"] == name),
                    key=lambda row: row["ms"], default=None) for name in GEMMS]  # fmt: skip
        if None not in best:
            pairs.append((best[0]["ms"] + best[1]["ms"], best[0]["tile"] != heuristic, best))
    _, _, tuned = min(pairs, key=lambda pair: pair[:2])  # a tie keeps the heuristic
    heuristic_ms = [final[0]["ms"], final[1]["ms"]]
    return {
        "model": step.model, "format": step.fmt, "tokens": step.tokens, "slots": r.slots,
        "shape": shape_key(step.fmt, shape, on_gemv(step.fmt, r.slots, r.experts)).key(),
        "heuristic": {"tile": heuristic, "gate_up_ms": heuristic_ms[0],
                      "down_ms": heuristic_ms[1]},
        "tuned": {"gate_up": tuned[0], "down": tuned[1]},
        "speedup": sum(heuristic_ms) / (tuned[0]["ms"] + tuned[1]["ms"]),
        "finalists": {name: {tile_name(row["tile"]): row["ms"] for row in final
                             if row["gemm"] == name} for name in GEMMS},
        "screened": {name: {tile_name(row["tile"]): row.get("ms", row.get("error"))
                            for row in rows} for name, rows in screened.items()},
    }  # fmt: skip


def merge_table(directory: Path, rows: list[dict[str, Any]], command: str) -> Path:
    name = torch.cuda.get_device_name()
    path = table_path(name) if directory == TABLE_DIR else directory / table_path(name).name
    table = json.loads(path.read_text()) if path.exists() else {"shapes": {}}
    run = {"command": command, "commit": git_commit(), "date": dt.date.today().isoformat()}
    runs = [r for r in table.get("produced_by", []) if r["command"] != command]
    table |= {"device": name, "produced_by": [*runs, run]}  # every run that wrote entries
    for row in rows:
        entry = {"gate_up": row["tuned"]["gate_up"]["tile"], "down": row["tuned"]["down"]["tile"]}
        table["shapes"].setdefault(row["shape"], {})[str(row["tokens"])] = entry
    for key, entries in table["shapes"].items():
        table["shapes"][key] = dict(sorted(entries.items(), key=lambda kv: int(kv[0])))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table_text(table))
    return path


def table_text(table: dict[str, Any]) -> str:
    """JSON with the stamp first, one line a run and one line a token count."""
    runs = ",\n".join(f"  {json.dumps(run)}" for run in table["produced_by"])
    shapes = ",\n".join(
        f"  {json.dumps(key)}: {{\n"
        + ",\n".join(f"   {json.dumps(t)}: {json.dumps(e)}" for t, e in entries.items())
        + "\n  }"
        for key, entries in table["shapes"].items()
    )
    device = json.dumps(table["device"])
    return (f'{{\n "device": {device},\n "produced_by": [\n{runs}\n ],\n "shapes": {{\n'
            + shapes + "\n }\n}\n")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3-30b-a3b,glm-4.5-air")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4")
    ap.add_argument("--tokens", default=TOKENS)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--table", type=Path, default=TABLE_DIR)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    steps = list(tuned_steps(args.models.split(","), args.formats.split(","),
                             [int(t) for t in args.tokens.split(",")], args.tp))  # fmt: skip
    if args.workers > 0:
        warm_in_workers(steps, args.workers)
    command = "python -m benchmarks.moe_tune " + " ".join(
        f"--{key} {getattr(args, key)}" for key in ("models", "formats", "tokens", "tp")
    )
    rows: list[dict[str, Any]] = []
    experts: dict[tuple[str, str], Experts] = {}
    for step, shape in steps:
        if (step.model, step.fmt) not in experts:
            experts.clear()
            torch.cuda.empty_cache()
            experts[(step.model, step.fmt)] = Experts(step.fmt, shape)
        rows.append(tune_step(step, shape, experts[(step.model, step.fmt)]))
        row = rows[-1]
        print(f"{step.model} {step.fmt} T={step.tokens}: heuristic "
              f"{row['heuristic']['gate_up_ms'] + row['heuristic']['down_ms']:.4f} ms, tuned "
              f"{row['tuned']['gate_up']['ms'] + row['tuned']['down']['ms']:.4f} ms "
              f"(x{row['speedup']:.2f})", flush=True)  # fmt: skip
        write_result(f"moe_tune_{args.tag}", {"tp": args.tp, "rows": rows}, args.out_dir)
        table = merge_table(args.table, [row], command)  # after each step: a cut run keeps it
    print(f"table: {table}")


if __name__ == "__main__":
    main()
