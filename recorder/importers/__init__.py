"""Importers: runs recorded by other harnesses, written as events through the normal spool path.

Each importer reads a foreign run (an AutoMedBench run folder, an ATIF trajectory, an Inspect log),
builds the whole run in memory first (``common.RunBuilder``), and only then writes it: blobs into
the blob store, then one spool of source ``import`` that appears under its final name in one
rename. A rejected input therefore leaves the store untouched, and a run id derived from the
input's content makes a second import of the same input a no-op.
"""
