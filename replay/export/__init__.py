"""Exporters: stored runs out to the formats other tools read (ATIF, OpenTelemetry, Parquet).

Read side only: events and blobs in, files out. Every exporter is deterministic for the same
stored run, so re-exports are byte-identical and diffable.
"""
