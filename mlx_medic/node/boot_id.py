"""Which boot this node is in: the protection-domain ledger is per boot, since only a
reboot gives back the domains a killed JACCL rank spent.

Linux: the kernel's random per-boot id. Elsewhere (macOS): the boot time as psutil reads
it (on macOS from the `kern.boottime` sysctl), whole seconds so a re-read never differs.
Tests pass their own boot id to simulate a reboot. Each testbed node has a boot id of its
own: the testbed bind-mounts a file over /proc/sys/kernel/random/boot_id in the node's
mount namespace (new at every start and `Cluster.reboot`), so a node's processes read
its boot id there and the host's stays the host's (testbed/README.md, "Boot ids").
"""

from __future__ import annotations

import sys
from pathlib import Path

LINUX_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id(platform: str = sys.platform) -> str:
    if platform.startswith("linux"):
        return LINUX_BOOT_ID.read_text(encoding="ascii").strip()
    import psutil  # only where there is no boot id file

    return f"boottime:{int(psutil.boot_time())}"
