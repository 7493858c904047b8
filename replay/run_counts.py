"""What the recorder says each source of a run wrote, against what the store holds (``amb verify``).

The recorder counts, when a run ends, the events each source wrote (``run.finished``'s ``counts``).
A source holding fewer lost some before the store (a spool that ingest refused, as one an agent
damaged: the run's other spools load and it would look whole) or after (events deleted from the
end of a chain).
"""

from __future__ import annotations

from schemas.untrusted_json import loads_untrusted


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
