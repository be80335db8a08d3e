"""One row of the preflight report: a check's status, what was seen, what was expected, the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class CheckResult:
    name: str  # "group: what", e.g. "gpu: persistence mode"
    status: Status
    observed: str
    expected: str = ""
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        return out


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name, Status.SKIP, reason)


def worst(statuses: list[Status]) -> Status:
    """FAIL over WARN over PASS; SKIP only when nothing else is there."""
    for status in (Status.FAIL, Status.WARN, Status.PASS):
        if status in statuses:
            return status
    return Status.SKIP
