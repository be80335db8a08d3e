"""kvserve's own settings: each ``KVSERVE_*`` variable set here is one the engine reads, with a
value it takes (a refused one would stop the engine at load; a misspelt one does nothing)."""

from __future__ import annotations

import difflib

from kvserve.env_settings import SETTINGS
from kvserve.preflight.facts import SettingFact
from kvserve.preflight.result import CheckResult, Status

NAME = "kvserve: settings"
EXPECTED = "KVSERVE_* variables kvserve reads, with values it takes (README, Settings)"


def check_settings(settings: tuple[SettingFact, ...]) -> list[CheckResult]:
    if not settings:
        return [CheckResult(NAME, Status.PASS, "none set: every default")]
    rows = [_refused(s) for s in settings if s.problem]
    rows += [_unknown(s) for s in settings if s.unknown]
    taken = [f"{s.name}={s.value}" for s in settings if not s.problem and not s.unknown]
    if taken:
        rows.append(CheckResult(NAME, Status.PASS, ", ".join(taken), EXPECTED))
    return rows


def _refused(setting: SettingFact) -> CheckResult:
    if not setting.fatal:  # the engine warns and keeps its default
        fix = f"the engine ignores it and keeps its default: correct or unset {setting.name}"
        return CheckResult(NAME, Status.WARN, setting.problem, EXPECTED, fix)
    fix = f"the engine would refuse to start: unset {setting.name} or give it a value it takes"
    return CheckResult(NAME, Status.FAIL, setting.problem, EXPECTED, fix)


def _unknown(setting: SettingFact) -> CheckResult:
    close = difflib.get_close_matches(setting.name, [s.name for s in SETTINGS], n=1)
    fix = f"did you mean {close[0]}?" if close else "unset it: kvserve ignores it"
    observed = f"{setting.name}={setting.value}: not a setting kvserve reads"
    return CheckResult(NAME, Status.WARN, observed, EXPECTED, fix)
