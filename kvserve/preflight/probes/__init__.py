"""Probes: each reads one real source and returns facts; none of them judges what it reads."""

from __future__ import annotations
