"""`kvserve <command>`: dispatches to one module per command, imported only when used.

Each command module exposes ``main(argv: list[str]) -> int`` with its own argparse parser
(``prog="kvserve <command>"``). User errors (``KVServeError``) print as one line, exit code 2.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kvserve.server.serve_cli", "run the OpenAI-compatible server"),
    "route": ("kvserve.router.cli", "route OpenAI requests over several workers"),
    "demo": ("kvserve.server.demo_cli", "start a server on the bundled model and load it"),
    "generate": ("kvserve.engine.generate_cli", "generate offline from prompts"),
    "bench": ("kvserve.bench.cli", "load-test an OpenAI-compatible server"),
    "preflight": ("kvserve.preflight.cli", "check this node's GPU stack before serving"),
    "eval": ("kvserve.evaluate.cli", "accuracy per task type: baseline against candidates"),
    "monitor": ("kvserve.preflight.monitor_cli", "sample GPU temperature/clocks/throttle"),
}


def _usage() -> str:
    lines = ["usage: kvserve <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "`kvserve <command> --help` documents each command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from kvserve import __version__

        print(f"kvserve {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kvserve: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from kvserve.errors import KVServeError

    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except KVServeError as exc:
        print(f"kvserve {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
