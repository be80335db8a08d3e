"""Load time of a pre-quantized FP8 checkpoint against online FP8 quantization of the same
model: writes the Llama-3-8B shape with random bf16 weights (one safetensors file per layer),
then its FP8 version as compressed-tensors stores it (e4m3 weights with one scale per output
channel, dynamic per-token activations, lm_head and embeddings left in bf16), and times
``LLM(...)`` from the call to a ready engine, in a fresh process per load, alternating the two.
Both checkpoints are read once before timing, so every timed load reads from the page cache.

    python -m benchmarks.quant_load_time --tokenizer-dir .tok           # H200, the 8B shape
    python -m benchmarks.quant_load_time --smoke                        # CPU, a tiny Llama
Writes benchmarks/results/quant_load_time_<tag>_<date>.json (or under --out-dir).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from benchmarks.code_ab import TINY_LLAMA
from benchmarks.common import LLAMA_8B, write_result
from benchmarks.random_checkpoint import llama_shards, random_tensor
from kvserve.quant.fp8_weights import quantize_weight

_ACTIVATIONS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True,
                "strategy": "token"}  # fmt: skip
_WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
            "strategy": "channel"}  # fmt: skip
COMPRESSED_TENSORS_FP8 = {
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "float-quantized",
                                  "weights": _WEIGHTS, "input_activations": _ACTIVATIONS}},
}  # fmt: skip
LOAD = """
import json, sys, time
t = time.perf_counter()
from kvserve import LLM
llm = LLM(sys.argv[1], device=sys.argv[2], quantization=sys.argv[3] or None)
print(json.dumps({"load_s": time.perf_counter() - t}))
"""


def to_fp8(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors' channel-wise FP8: ``weight`` in e4m3 and ``weight_scale`` [N, 1]."""
    if t.dim() != 2 or not name.startswith("model.layers."):
        return {name: t}
    q, scale = quantize_weight(t, "channel")
    return {name: q, name + "_scale": scale[:, None].to(torch.bfloat16)}


def write_checkpoints(cfg: dict[str, Any], root: Path, device: str, tok: str | None) -> list[Path]:
    """The bf16 checkpoint and its FP8 version, each with the tokenizer."""
    from kvserve.loader import load_tokenizer

    dirs = [root / "bf16", root / "fp8"]
    gen = torch.Generator(device=device).manual_seed(0)
    index: list[dict[str, str]] = [{}, {}]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        load_tokenizer(tok).hf.save_pretrained(d)
    for k, shapes in enumerate(llama_shards(cfg)):
        file = f"model-{k:05d}.safetensors"
        bf16 = {name: random_tensor(shape, device, gen) for name, shape in shapes.items()}
        fp8 = {n: t for name, w in bf16.items() for n, t in to_fp8(name, w).items()}
        for tensors, d, idx in zip((bf16, fp8), dirs, index):
            save_file(tensors, str(d / file))
            idx.update(dict.fromkeys(tensors, file))
    for d, idx, quant in zip(dirs, index, (None, COMPRESSED_TENSORS_FP8)):
        config = {**cfg, **({"quantization_config": quant} if quant else {})}
        (d / "config.json").write_text(json.dumps(config))
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": idx}))
    return dirs


def read_through(d: Path) -> int:
    """Read every file once (into the page cache); bytes read."""
    total = 0
    for f in d.glob("*.safetensors"):
        with f.open("rb") as stream:
            while chunk := stream.read(1 << 26):
                total += len(chunk)
    return total


def time_load(model: Path, device: str, quantization: str) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD, str(model), device, quantization],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])["load_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.quant_load_time")
    ap.add_argument("--model-config", default=LLAMA_8B)
    ap.add_argument("--tokenizer-dir", default=None, help="default: the bundled tokenizer")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny Llama")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    cfg = (
        dict(TINY_LLAMA)
        if args.smoke
        else json.loads((Path(args.model_config) / "config.json").read_text())
    )
    cfg["torch_dtype"] = "bfloat16"
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="quant-load-"))
    bf16_dir, fp8_dir = write_checkpoints(cfg, root, device, args.tokenizer_dir)
    sizes = {"bf16_bytes": read_through(bf16_dir), "fp8_bytes": read_through(fp8_dir)}
    online, prequantized = [], []
    for _ in range(args.repeats):
        online.append(time_load(bf16_dir, device, "fp8"))
        prequantized.append(time_load(fp8_dir, device, ""))
    result = {"model_config": "tiny" if args.smoke else args.model_config, "device": device,
              **sizes, "online_fp8_load_s": online, "prequantized_fp8_load_s": prequantized,
              "online_over_prequantized": min(online) / min(prequantized),
              "note": "seconds from LLM(...) to a ready engine, fresh process each, page cache "
                      "warm; both checkpoints written by this script"}  # fmt: skip
    print(json.dumps(result, indent=1))
    tag = "smoke" if args.smoke else device
    print(f"wrote {write_result(f'quant_load_time_{tag}', result, args.out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
