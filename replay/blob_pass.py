"""The blob pass of ``amb verify`` in a process of its own, beside the database's checks.

The pass (``BlobStore.verify_many``: every pack streamed, each record decompressed and re-hashed)
is Python work that holds the GIL for most of its time, and so is the events' hash check
(``replay.verify``): in one process the two take turns. A child process runs it on the other core
instead. The child reads only the blob files, which another process sees exactly as this one does
(the database's checks, which must see the caller's open transaction, stay on the caller's
connection).

The child is a plain ``python -m replay.blob_pass ROOT``, not a ``multiprocessing`` process: this
process has DuckDB's threads running (a fork would copy them mid-flight), and a spawned
``multiprocessing`` child runs the caller's main script again, which a script without a
``__main__`` guard cannot survive. Addresses go in on stdin, one per line; progress and the result
come back on stdout as JSON lines.

If the child cannot start or does not finish with a result (killed, out of memory), the pass runs
again here: a verify never passes for want of a blob pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from schemas.blobstore import BlobStore

Progress = Callable[[int, int], None]

_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the ``replay`` and ``schemas`` packages this process imported."""


def verify_apart(blobs: BlobStore, addresses: list[str], progress: Progress | None = None) -> dict[str, str]:
    """``blobs.verify_many(addresses, progress)``, computed in a child process."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "replay.blob_pass", str(blobs.root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # a child that fails is replaced by the pass run here, below
            env=env,
        )
    except OSError:
        return blobs.verify_many(addresses, progress)
    assert child.stdin is not None and child.stdout is not None  # both are pipes
    feeder = threading.Thread(target=_feed, args=(child.stdin, addresses), daemon=True)
    feeder.start()
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
            child.kill()  # leaving on an error of this process
        child.wait()
        feeder.join()
    if result is None or child.returncode != 0:
        return blobs.verify_many(addresses, progress)
    return result


def _feed(pipe: IO[bytes], addresses: list[str]) -> None:
    try:
        pipe.write("".join(a + "\n" for a in addresses).encode())
        pipe.close()
    except (BrokenPipeError, OSError):
        pass  # the child died: its missing result says so


def main(root: str) -> None:
    addresses = sys.stdin.read().split()
    out = sys.stdout

    def report(done: int, total: int) -> None:
        out.write(json.dumps({"progress": [done, total]}) + "\n")
        out.flush()

    problems = BlobStore(root).verify_many(addresses, report)
    out.write(json.dumps({"problems": problems}) + "\n")
    out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
