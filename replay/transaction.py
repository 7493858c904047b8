"""One DuckDB transaction, whose failure is the one reported.

A COMMIT that fails (the disk is full, the write-ahead log cannot grow) has already ended the
transaction, and DuckDB then refuses the ROLLBACK with "no transaction is active": rolling back
unconditionally would replace the cause with that message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Everything in the block is stored, or nothing is; the block's own error propagates."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        # Nothing to roll back (a failed COMMIT ended it) or a connection DuckDB has invalidated:
        # either way the transaction is gone, and the error worth reading is the one propagating.
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
