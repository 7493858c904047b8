"""The read side and the single DuckDB writer: store, ingest, verify, typed read-back, SQL.

Depends on ``schemas`` only.
"""
