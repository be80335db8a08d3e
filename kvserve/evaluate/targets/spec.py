"""``--baseline`` / ``--candidate`` specs.

- ``[NAME=]URL[,model=ID][,api_key=KEY]``: an OpenAI-compatible server.
- ``[name=NAME,]model=PATH[,SETTING=VALUE...]``: a kvserve engine in this process; every other
  key is passed to ``kvserve.LLM`` as an engine setting (``dtype=bfloat16``,
  ``quantization=nvfp4``, ``max_running_requests=32``, ...). ``model=bundled`` (or no model)
  is the bundled model.
"""

from __future__ import annotations

import re
from typing import Any

from kvserve.errors import ConfigError
from kvserve.evaluate.targets.engine import EngineTarget
from kvserve.evaluate.targets.http import HttpTarget

_HTTP = re.compile(r"^(?:(?P<name>[\w.+-]+)=)?(?P<url>https?://[^,\s]+)(?:,(?P<opts>.*))?$")
_NAME = re.compile(r"^[\w.+-]+$")
_USAGE = "expected [NAME=]URL[,model=ID] or [name=NAME,]model=PATH[,SETTING=VALUE...]"


def _pairs(text: str, flag: str, spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {spec!r}: {part!r} is not KEY=VALUE ({_USAGE})")
        out[key.strip()] = value.strip()
    return out


def _value(text: str) -> Any:
    """Engine setting values as Python values: ints, floats, true/false, none, else text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_target(spec: str, flag: str, default_name: str, api_key: str | None = None,
                 timeout_s: float = 600.0) -> HttpTarget | EngineTarget:  # fmt: skip
    spec = spec.strip()
    http = _HTTP.match(spec)
    if http:
        opts = _pairs(http["opts"] or "", flag, spec)
        unknown = set(opts) - {"model", "api_key"}
        if unknown:
            raise ConfigError(f"{flag} {spec!r}: unknown option {sorted(unknown)[0]!r} "
                              "(a server takes model= and api_key=)")  # fmt: skip
        return HttpTarget(http["name"] or default_name, http["url"].rstrip("/"),
                          opts.get("model"), opts.get("api_key", api_key), timeout_s)  # fmt: skip
    if "=" not in spec:
        raise ConfigError(f"{flag} {spec!r}: {_USAGE}")
    pairs = _pairs(spec, flag, spec)
    name = pairs.pop("name", None)
    model = pairs.pop("model", None)
    settings = {k.replace("-", "_"): _value(v) for k, v in pairs.items()}
    if name is None:  # named after the setting that most often tells candidates apart
        name = str(settings.get("quantization") or settings.get("dtype") or default_name)
    if not _NAME.match(name):
        raise ConfigError(f"{flag} {spec!r}: a target name takes letters, digits and ._+-")
    return EngineTarget(name, None if model in (None, "", "bundled") else model, settings)
