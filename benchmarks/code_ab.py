"""A/B of two source trees on one machine: decode at batch 1/64/256 (1K context) and an offline
run, each side in fresh processes that alternate, so that drift in the GPU's clocks falls on both.

Each process imports kvserve from its tree (PYTHONPATH) and runs ``code_ab_worker.py`` from this
tree, which uses only what both layouts have. Llama-3-8B shape, bf16 dummy weights, the
roofline's engine settings and decode method. The offline part is reduced (200 x 1024 in /
1024 out by default, one wave of requests) to fit a device budget; the roofline's offline figure
is 1000 x 1024/1024. Rounds alternate the order (base, head), (head, base), ... (``--head-first``
starts with the head). Writes code_ab_<tag>_<date>.json after every round: both sides per round
and head / base ratios.

    git archive f3c4956 | tar -x -C abbase      # an export of the old commit, made beforehand
    python -m benchmarks.code_ab --base-tree abbase --base-label f3c4956 --out-dir $OUT
    python -m benchmarks.code_ab --base-tree abbase --quick   # a tiny CPU model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import LLAMA_8B, git_commit, tree_env, write_result

HEAD_TREE = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "code_ab_worker.py"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 4096, "max_position_embeddings": 1024, "eos_token_id": 0,
}  # fmt: skip
QUICK = ["--device", "cpu", "--dtype", "float32", "--batches", "1,4", "--context", "64",
         "--out-lo", "4", "--out-hi", "12", "--offline", "6,64,16", "--budget", "512",
         "--max-running", "8"]  # fmt: skip


def run_side(tree: Path, worker_args: list[str], timeout_s: float) -> dict[str, Any]:
    """One fresh process measuring the kvserve of ``tree``."""
    with tempfile.TemporaryDirectory(prefix="code_ab_") as tmp:
        out = Path(tmp) / "side.json"
        env = {**os.environ, **tree_env(tree)}
        cmd = [sys.executable, str(WORKER), *worker_args, "--json-out", str(out)]
        proc = subprocess.run(cmd, cwd=tree, env=env, timeout=timeout_s, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"the {tree} side failed (exit {proc.returncode}):\n{proc.stdout}")
        result = json.loads(out.read_text())
    if not Path(result["kvserve_file"]).is_relative_to(tree):
        raise SystemExit(f"the {tree} side imported kvserve from {result['kvserve_file']}")
    return result


def figures(side: dict[str, Any]) -> dict[str, float]:
    rates = {f"decode_b{b}_tok_s": r["tok_s"] for b, r in side["decode"].items()}
    return {**rates, "offline_output_tok_s": side["offline"]["output_tok_s"]}


def ratios(base: dict[str, Any], head: dict[str, Any]) -> dict[str, float]:
    b, h = figures(base), figures(head)
    return {k: h[k] / b[k] for k in b}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure: the mean of each side over the rounds and the mean of the per-round ratios."""
    keys = figures(rounds[0]["base"])
    return {
        k: {
            "base_mean": statistics.mean(figures(r["base"])[k] for r in rounds),
            "head_mean": statistics.mean(figures(r["head"])[k] for r in rounds),
            "ratio_mean": statistics.mean(r["ratio_head_over_base"][k] for r in rounds),
            "ratios": [r["ratio_head_over_base"][k] for r in rounds],
        }
        for k in keys
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-tree", required=True, help="a source tree of the older commit")
    ap.add_argument("--base-label", default="base", help="its commit, for the JSON")
    ap.add_argument("--head-tree", default=str(HEAD_TREE), help="default: this tree")
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--head-first", action="store_true", help="rounds start with the head tree")
    ap.add_argument("--batches", default="1,64,256", help="decode batch sizes")
    ap.add_argument("--offline", default="200,1024,1024", help="requests,input_len,output_len")
    ap.add_argument("--side-timeout", type=float, default=240, help="seconds per process")
    ap.add_argument("--quick", action="store_true", help="a tiny model on the CPU (a check)")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    trees = {"base": Path(args.base_tree).resolve(), "head": Path(args.head_tree).resolve()}
    for name, tree in trees.items():
        if not (tree / "kvserve" / "__init__.py").is_file():
            raise SystemExit(f"--{name}-tree {tree}: no kvserve package there")
    tmp = tempfile.TemporaryDirectory(prefix="code_ab_model_")
    model = str(Path(args.model).resolve())
    worker_args = ["--offline", args.offline, "--batches", args.batches]
    if args.quick:
        model = tmp.name
        (Path(model) / "config.json").write_text(json.dumps(TINY_LLAMA))
        worker_args = QUICK
        args.tag = f"{args.tag}_quick"
    worker_args = ["--model", model, *worker_args]
    payload: dict[str, Any] = {
        "base": {"tree": str(trees["base"]), "commit": args.base_label},
        "head": {"tree": str(trees["head"]), "commit": git_commit()},
        "model": "tiny Llama (quick check)" if args.quick else args.model,
        "worker_args": worker_args,
        "method": "decode: tokens between output lengths 64 and 192 at 1K context, as "
        "roofline.py; offline: requests x (input, output) random tokens, ignore_eos",
        "offline_note": "reduced from the roofline's 1000 x 1024/1024 to fit the device budget",
        "rounds": [],
    }
    for r in range(args.rounds):
        order = ("base", "head") if (r + args.head_first) % 2 == 0 else ("head", "base")
        sides = {name: run_side(trees[name], worker_args, args.side_timeout) for name in order}
        row = {"round": r, "order": list(order), **sides,
               "ratio_head_over_base": ratios(sides["base"], sides["head"])}  # fmt: skip
        payload["rounds"].append(row)
        payload["summary"] = summary(payload["rounds"])
        print(f"round {r}: head / base {row['ratio_head_over_base']}", flush=True)
        path = write_result(f"code_ab_{args.tag}", payload, args.out_dir)
    print(f"wrote {path}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
