"""The blob pass of ``amb verify``, started before the database has found which blobs it must check.

The pass (``schemas.blobverify.verified_records``: every pack streamed, each record re-hashed) needs
no list of referenced blobs; only the judging after it does (``blobverify.judge``). So it starts at
once, beside the database's scan of the events, and is handed the references when they are known.

It holds the GIL for most of its time, and so does the events' hash check: for a big store it runs
in a child process on the other core (the database's checks, which must see the caller's open
transaction, stay here). The child is ``python -P -m replay.blob_pass ROOT`` (``-P``: amb's own
module, not one of the same name in the working directory), not ``multiprocessing``: a fork would
copy DuckDB's running threads, and a spawned child runs the caller's main script again. It reports
progress on stdout as JSON lines, reads the addresses from stdin, and writes the problems as a last
JSON line. A child that gives no result is replaced by the pass run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

from replay.blob_reads import ArrayReads
from schemas import blobverify
from schemas.blobstore import BlobStore

Progress = Callable[[int, int], None]

_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the ``replay`` and ``schemas`` packages this process imported."""


class BlobPass:
    """The pass over every pack, started now (in a child process if ``apart``, else in a thread of
    this one: DuckDB releases the GIL while it works); ``result(addresses)`` judges the blobs."""

    def __init__(self, blobs: BlobStore, progress: Progress | None = None, apart: bool = False):
        self.blobs, self.progress = blobs, progress
        self._pool = ThreadPoolExecutor(1)
        self._child = _start_child(blobs) if apart else None
        if self._child is not None:
            # Read the child's progress as it comes (a full pipe would stall its pass).
            self._answer: Future[dict[str, str] | None] = self._pool.submit(
                _read_child, self._child, progress
            )
        else:
            self._reads: Future[ArrayReads] = self._pool.submit(_pass, blobs, progress)

    def result(self, addresses: Iterable[str]) -> dict[str, str]:
        """The reason for each of ``addresses`` that is missing or damaged."""
        try:
            if self._child is None:
                return blobverify.judge(self.blobs, addresses, self._reads.result())
            assert self._child.stdin is not None  # a pipe
            _feed(self._child.stdin, addresses)
            found = self._answer.result()
            if found is None:
                return blobverify.verify_many(self.blobs, list(addresses), self.progress)
            return found
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop the pass if it still runs (``result`` was not asked for: the verify failed first)."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
        self._pool.shutdown(wait=True)


def _pass(blobs: BlobStore, progress: Progress | None) -> ArrayReads:
    """The pass over every pack, its bookkeeping in arrays (memory for a big store: ``blob_reads``)."""
    reads = ArrayReads(blobs)
    blobverify.verified_records(blobs, reads, progress)
    return reads


def _start_child(blobs: BlobStore) -> subprocess.Popen[bytes] | None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "replay.blob_pass", str(blobs.root)],  # (-P: not the cwd's modules)
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # a child that fails is replaced by the pass run here
            env=env,
        )
    except OSError:
        return None


def _read_child(child: subprocess.Popen[bytes], progress: Progress | None) -> dict[str, str] | None:
    """The child's problems, forwarding its progress; None if it gave no sound answer."""
    assert child.stdout is not None  # a pipe
    result: dict[str, str] | None = None
    try:
        for line in child.stdout:
            message = json.loads(line)
            if "progress" in message and progress:
                progress(*message["progress"])
            elif "problems" in message:
                result = message["problems"]
    except (ValueError, TypeError):
        result = None  # a line that is not ours: trust nothing it said
    finally:
        if child.poll() is None and result is None:
            child.kill()
        child.wait()
    return result if child.returncode == 0 else None


def verify_apart(
    blobs: BlobStore, addresses: Iterable[str], progress: Progress | None = None
) -> dict[str, str]:
    """``blobverify.verify_many(blobs, addresses, progress)``, computed in a child process."""
    return BlobPass(blobs, progress, apart=True).result(addresses)


def _feed(pipe: IO[bytes], addresses: Iterable[str]) -> None:
    """The addresses to the child, a line each, written as they come (a million of them are not
    made one string first)."""
    try:
        for a in addresses:
            pipe.write(f"{a}\n".encode())
        pipe.close()
    except (BrokenPipeError, OSError):
        pass  # the child died: its missing result says so


def main(root: str) -> None:
    out = sys.stdout

    def report(done: int, total: int) -> None:
        out.write(json.dumps({"progress": [done, total]}) + "\n")
        out.flush()

    blobs = BlobStore(root)
    reads = _pass(blobs, report)
    problems = blobverify.judge(blobs, (line.strip() for line in sys.stdin), reads)
    out.write(json.dumps({"problems": problems}) + "\n")
    out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
