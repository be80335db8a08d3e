"""NVML clock-event ("throttle") reasons: decode the bitmask by name and say which ones hurt."""

from __future__ import annotations

# nvmlClocksEventReason* bits (nvml.h)
REASONS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
# Clocks are held down by heat or by a hardware signal: throughput falls.
FAILING = frozenset(
    {"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}
)
# The board's power cap: normal under full load, worth a look when it persists.
WARNING = frozenset({"SwPowerCap"})


def decode(mask: int) -> list[str]:
    """Names of the set bits, in bit order; unknown bits as hex so nothing is hidden."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return names


def parse_mask(text: str) -> int | None:
    """nvidia-smi prints the mask as "0x0000000000000004"; "[N/A]" and blanks mean unknown."""
    text = text.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None
