"""The host firewall of a docker run: iptables rules that refuse whatever the run's container sends
to the host, except to the recording proxy's ports.

The container's ``--internal`` network cannot route to the internet, but it reaches every port the
host listens on at the network's gateway address; these rules close all of them but the proxy's.
Each rule's comment names the run (``FIREWALL_COMMENT`` + run id), so ``amb gc`` can find the rules
of a recorder that was killed (``recorder.gc``).
"""

from __future__ import annotations

import subprocess

FIREWALL_COMMENT = "amb-run:"


class HostFirewall:
    """The rules installed for one run, removed again by ``remove``."""

    def __init__(self) -> None:
        self.rules: list[list[str]] = []

    def install(self, bridge: str, ports: list[int], run_id: str) -> str | None:
        """Refuse what comes in on ``bridge`` except to ``ports``. Returns iptables' complaint when
        a rule could not be installed (the rules installed before it are removed again)."""
        inbound = ["INPUT", "-i", bridge]
        tag = ["-m", "comment", "--comment", f"{FIREWALL_COMMENT}{run_id}"]
        # REJECT rather than DROP: a probe gets "connection refused" at once instead of hanging.
        rules = [[*inbound, *tag, "-j", "REJECT"]]
        rules += [[*inbound, "-p", "tcp", "--dport", str(p), *tag, "-j", "ACCEPT"] for p in ports]
        rules.append([*inbound, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", *tag, "-j", "ACCEPT"])
        for rule in rules:  # each is inserted at the top, so the last inserted is checked first
            proc = subprocess.run(["iptables", "-w", "-I", *rule], capture_output=True, text=True)
            if proc.returncode != 0:
                self.remove()
                return proc.stderr.strip()
            self.rules.append(rule)
        return None

    def remove(self) -> None:
        for rule in reversed(self.rules):
            subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True)
        self.rules.clear()
