from __future__ import annotations

from kvserve.preflight import throttle


def test_decode_names_each_bit() -> None:
    assert throttle.decode(0x1) == ["GpuIdle"]
    assert throttle.decode(0x60) == ["SwThermalSlowdown", "HwThermalSlowdown"]
    assert throttle.decode(0x4 | 0x80) == ["SwPowerCap", "HwPowerBrakeSlowdown"]
    assert throttle.decode(0) == []


def test_unknown_bits_are_shown_not_dropped() -> None:
    assert throttle.decode(0x1 | 0x800) == ["GpuIdle", "0x800"]


def test_parse_mask_reads_nvidia_smi_hex_and_rejects_na() -> None:
    assert throttle.parse_mask("0x0000000000000024") == 0x24
    assert throttle.parse_mask("[N/A]") is None
