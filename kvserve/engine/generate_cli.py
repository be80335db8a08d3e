"""`kvserve generate`: offline generation from the command line (the `LLM` API behind it)."""

from __future__ import annotations

import argparse
import json
import sys

from kvserve.flags import add_flags, engine_settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvserve generate",
        description="Generate offline from prompts or chat messages, in one batch.",
    )
    p.add_argument("--model", help="HF model directory or .gguf file (default: the bundled model)")
    p.add_argument("--prompt", action="append", default=[], help="a raw prompt (repeatable)")
    p.add_argument("--chat", action="append", default=[], help="a user message (repeatable)")
    p.add_argument("--system", help="system message for --chat")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--sampling-seed", type=int, help="per-request seed")
    p.add_argument("--json", action="store_true", help="one JSON object per output")
    add_flags(p, engine_only=True)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.prompt and not args.chat:
        print("kvserve generate: give --prompt or --chat", file=sys.stderr)
        return 2
    from kvserve import LLM, SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.sampling_seed,
    )
    llm = LLM(args.model, **engine_settings(args))
    outputs = llm.generate(args.prompt, params) if args.prompt else []
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        convs = [[*system, {"role": "user", "content": c}] for c in args.chat]
        outputs += llm.chat(convs, params)
    for out in outputs:
        if args.json:
            print(json.dumps({"text": out.text, "finish_reason": out.finish_reason,
                              "prompt_tokens": out.prompt_tokens,
                              "completion_tokens": out.completion_tokens,
                              "cached_tokens": out.cached_tokens}))  # fmt: skip
        else:
            print(out.text)
    return 0
