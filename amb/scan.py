"""Write your own scanner: ``from amb.scan import scanner, Finding`` (see docs/scanning.md).

A scanner is a function of one run's ``Trajectory`` (``scorer.trajectory``: model calls with their
messages and tool calls, code executions and their results, processes, file writes, network
requests, notes, the sealed submission, the run's metadata) that returns None, a ``Finding`` or a
list of them; each finding cites the events (``source:seq``) that show it. Run it with ``amb scan``.
"""

from schemas.finding import Finding
from scorer.scanners import scanner
from scorer.trajectory import Trajectory

__all__ = ["Finding", "Trajectory", "scanner"]
