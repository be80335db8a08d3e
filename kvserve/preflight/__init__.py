"""`kvserve preflight`: probe a GPU node's whole stack and check it before serving.

Probes (``probes/``) read one real source each (NVML, a command's output, a sysfs tree, a file)
and return facts (``facts.py``); checks (``checks/``) are pure functions of those facts that
return rows with an observed value, an expectation and a fix (``result.py``). ``monitor.py``
samples GPU temperature, clocks and throttle reasons over time.
"""

from __future__ import annotations
