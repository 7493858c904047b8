"""Exporters: stored runs out to the formats other tools read (ATIF, OpenTelemetry, Parquet).

Read side only: events and blobs in, files out. Every exporter is deterministic for the same
stored run, so re-exports are byte-identical and diffable.
"""

from collections.abc import Callable

from schemas.blob import BlobRef

BlobReader = Callable[[BlobRef | str], bytes]
"""How an exporter reads a blob's content, by its reference or address."""
