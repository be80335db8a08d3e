"""Greedy top-1 agreement of the bundled model quantized online with the unquantized model, on
CPU (issue 12: "answers sensibly"; a quality figure, not a speed one).

    python -m benchmarks.lowbit_agreement --formats fp8,nvfp4,mxfp4 --out-dir benchmarks/results

For each prompt the unquantized model's greedy continuation of ``--tokens`` tokens is the
reference; the quantized model is then asked for one greedy token after every prefix of it
(teacher forcing), and agreement is the share of positions where its token equals the
reference's. Writes lowbit_agreement_cpu_<formats>_<date>.json.
"""

from __future__ import annotations

import argparse
from typing import Any

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colors are",
    "Once upon a time, in a small village,",
    "To make a cup of tea, first",
    "The largest planet in our solar system is",
    "import numpy as np\n\nx = np.arange(10)\n",
]


def greedy(max_tokens: int) -> Any:  # noqa: ANN401 - kvserve's SamplingParams
    from kvserve import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def reference_continuations(base: Any, tokens: int) -> list[tuple[list[int], list[int]]]:  # noqa: ANN401
    """(prompt ids, the unquantized model's greedy continuation) per prompt."""
    outs = base.generate(PROMPTS, greedy(tokens))
    return [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs]


def top1_agreement(quantized: Any, refs: list[tuple[list[int], list[int]]]) -> float:  # noqa: ANN401
    prefixes, expected = [], []
    for prompt, cont in refs:
        for i, token in enumerate(cont):
            prefixes.append(prompt + cont[:i])
            expected.append(token)
    outs = quantized.generate(prefixes, greedy(1))
    return sum(o.outputs[0].token_ids[0] == t for o, t in zip(outs, expected)) / len(expected)


def main() -> None:
    from benchmarks.common import write_result
    from kvserve import LLM

    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="fp8")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    refs = reference_continuations(LLM(device="cpu"), args.tokens)
    result: dict[str, Any] = {"model": "bundled SmolLM2-135M (Q4_1 GGUF, float32 on CPU)",
                              "prompts": PROMPTS, "tokens_per_prompt": args.tokens,
                              "method": "teacher-forced greedy top-1", "agreement": {}}  # fmt: skip
    for fmt in args.formats.split(","):
        quantized = LLM(device="cpu", quantization=fmt)
        result["agreement"][fmt] = top1_agreement(quantized, refs)
        print(f"{fmt}: top-1 agreement {result['agreement'][fmt]:.3f}", flush=True)
        del quantized
    name = f"lowbit_agreement_cpu_{args.formats.replace(',', '-')}"
    print(f"wrote {write_result(name, result, args.out_dir)}")


if __name__ == "__main__":
    main()
