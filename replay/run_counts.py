"""What the recorder says each source of a run wrote, against what the store holds (``amb verify``).

A source holding fewer events than ``run.finished``'s ``counts`` lost some before the store (a
spool ingest refused) or after (events deleted from the end of a chain). When the refused spool is
the recorder's own, the run has no ``run.started`` from the recorder (written before the agent
starts) and is named by that lack (``unstarted``). An imported run (source ``import``) is its own
whole: the recorder wrote none of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.untrusted_json import loads_untrusted

RECORDER = "recorder"
"""The source of ``run.started``, ``run.finished`` and their counts."""
IMPORTED = "import"
"""The one source of an imported run."""


def written(counts_json: str | None) -> dict[str, int]:
    """Events written per source, from a ``run.finished``'s ``counts`` (per source, or per
    ``source:kind`` as the recorder keeps them); what is not a count is left out."""
    try:
        counts = loads_untrusted(counts_json) if counts_json else None
    except ValueError:
        return {}
    found: dict[str, int] = {}
    for key, n in counts.items() if isinstance(counts, dict) else []:
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            source = key.split(":", 1)[0]
            found[source] = found.get(source, 0) + n
    return found


def short_sources(
    finished: list[tuple[str, str | None]], held: dict[tuple[str, str], int]
) -> list[tuple[str, str, str]]:
    """(run, source, why) of each source holding fewer events (``held``, by run and source) than its
    run's ``run.finished`` counts (``finished``: run and counts as JSON text) say were written."""
    short = []
    for run_id, counts_json in finished:
        for source, n in sorted(written(counts_json).items()):
            have = held.get((run_id, source), 0)
            if have < n:
                why = (
                    f"holds {have} events, but the recorder wrote {n} (its run.finished counts): "
                    "a spool was not loaded (see `amb ingest`) or events were removed"
                )
                short.append((run_id, source, why))
    return short


def unstarted(chains: Iterable[tuple[str, str, bool]]) -> list[tuple[str, str]]:
    """(run, why) of each run holding events from a source other than ``import`` but no
    ``run.started`` from the recorder (``chains``: run, source and whether that chain holds a
    ``run.started``), in the order of their first chain."""
    sources: dict[str, list[str]] = {}
    started: set[str] = set()
    for run_id, source, has_started in chains:
        if source == RECORDER and has_started:
            started.add(run_id)
        elif source != IMPORTED:
            sources.setdefault(run_id, []).append(source)
    return [
        (
            run_id,
            f"events from {', '.join(sorted(names))} but no run.started from the recorder: the recorder's "
            "spool was not loaded (see `amb ingest`) or its events were removed",
        )
        for run_id, names in sources.items()
        if run_id not in started
    ]
