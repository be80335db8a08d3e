"""The ``KVSERVE_*`` variables set in this environment, each read as the engine would read it."""

from __future__ import annotations

import os

from kvserve.env_settings import SETTINGS, read_setting, shown
from kvserve.preflight.facts import SettingFact


def probe_settings() -> tuple[SettingFact, ...]:
    environ = os.environ  # the readers read it too
    known = {s.name: s for s in SETTINGS}
    facts = []
    for name in sorted(n for n in environ if n.startswith("KVSERVE_")):
        setting = known.get(name)
        if setting is None:
            facts.append(SettingFact(name, environ[name], unknown=True))
        else:
            problem = read_setting(setting) or ""
            value = shown(setting, environ[name])
            facts.append(SettingFact(name, value, problem, fatal=not setting.directory))
    return tuple(facts)
