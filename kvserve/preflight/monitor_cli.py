"""`kvserve monitor`: sample GPU temperature, clocks, power and throttle reasons to JSONL."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from kvserve.errors import ConfigError
from kvserve.preflight.monitor import iter_samples, open_source


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvserve monitor",
        description="Sample every GPU's temperature, SM/memory clocks, power and throttle reasons "
        "until Ctrl-C, --count rounds or --duration seconds.",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--out", type=Path, help="append one JSON line per GPU per sample here")
    p.add_argument("--count", type=int, help="stop after this many sampling rounds")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--quiet", action="store_true", help="no line per sample on stdout")
    return p


def _validate(args: argparse.Namespace) -> None:
    if args.interval <= 0:
        raise ConfigError(f"--interval must be positive, got {args.interval}")
    if args.count is not None and args.count <= 0:
        raise ConfigError(f"--count must be positive, got {args.count}")
    if args.duration is not None and args.duration <= 0:
        raise ConfigError(f"--duration must be positive, got {args.duration}")


def _open_out(path: Path | None) -> TextIO | None:
    if path is None:
        return None
    try:
        return path.open("a")
    except OSError as exc:
        raise ConfigError(f"cannot write --out {path}: {exc.strerror}") from exc


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    _validate(args)
    source = open_source()
    out = _open_out(args.out)
    try:
        for samples in iter_samples(source, args.interval, args.count, args.duration):
            for sample in samples:
                if out is not None:
                    out.write(json.dumps(sample.to_dict()) + "\n")
                if not args.quiet:
                    print(sample.line(), flush=True)
            if out is not None:
                out.flush()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        source.close()
        if out is not None:
            out.close()
    return 0
