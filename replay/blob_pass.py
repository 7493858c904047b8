"""The blob pass of ``amb verify``, started before the database has found which blobs it must check.

The pass (``schemas.blobverify.verified_records``: every pack streamed, each record re-hashed) needs
no list of referenced blobs; only the judging after it does (``blobverify.judge``). So it starts at
once, beside the database's scan of the events, and is handed the references when they are known.

It holds the GIL for most of its time, and so does the events' hash check: for a big store it runs
in child processes, one per core but the one this process's scan of the events takes (the
database's checks, which must see the caller's open transaction, stay here). The packs are cut into
pieces of about ``PIECE`` bytes, handed out one at a time to whoever asks next: each child, and
this process once its scan is done (``result``), so that no core waits while another still has
work. A child is ``python -P -m replay.blob_pass ROOT PLAN`` (``-P``: amb's own module, not one of
the same name in the working directory), not ``multiprocessing``: a fork would copy DuckDB's
running threads, and a spawned child runs the caller's main script again. On stdout it asks for
pieces and reports progress, as JSON lines; on stdin it is given the pieces, then ``done``, then
the addresses to judge.

The judging is chained: this process keeps the addresses its own pieces vouch for and hands the
rest to the first child, which passes on (lines starting with ``>``) those its pieces do not vouch
for, and so on; the last child writes the problems of what is left as a last JSON line. A pass
whose children give no sound result is replaced by the pass run here.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from replay.blob_reads import WALK, ArrayReads, split
from replay.bounded import References
from schemas import blobverify
from schemas.blob import DIGEST_RE, HASH_PREFIX
from schemas.blobstore import BlobStore
from schemas.blobverify import Span

Progress = Callable[[int, int], None]

_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the ``replay`` and ``schemas`` packages this process imported."""


MAX_CHILDREN = 4
"""The most child processes the pass runs in."""

PART_MIN = 16 << 20
"""Bytes of packs from which the pass runs in child processes: starting a child (and reading the
index in it) costs a few hundred milliseconds, a pass over this many bytes about as much."""

PIECE = 48 << 20
"""Bytes of packs handed out at a time. Each piece's first deltas and chunk lists may need what the
piece before holds (their bases, their chunks), which are then read the ordinary way: a few per
piece."""


OWN_CACHE = blobverify.VERIFY_CACHE // 8
"""The content cache of this process's share: the last few pieces of the pass, taken while its
memory still holds what the scan of the events left."""


def children_for(pack_bytes: int) -> int:
    """How many children to start for a pass over this many bytes of packs: one per core but the
    one this process's scan takes (0: below ``PART_MIN``, the pass runs in a thread here)."""
    if pack_bytes < PART_MIN:
        return 0
    return max(1, min(len(os.sched_getaffinity(0)) - 1, MAX_CHILDREN))


def pack_bytes(blobs: BlobStore) -> int:
    total = 0
    for path in blobs.pack_files():
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass  # collected meanwhile: the pass says what became of its blobs
    return total


class BlobPass:
    """The pass over every pack, started now (in ``children`` child processes if ``apart``, which
    this process joins in ``result``; else in a thread of this one: DuckDB releases the GIL while
    it works); ``result(addresses)`` judges the blobs."""

    def __init__(
        self,
        blobs: BlobStore,
        progress: Progress | None = None,
        apart: bool = False,
        children: int = 1,
        piece: int = PIECE,
    ):
        self.blobs, self.progress = blobs, progress
        self._lock = threading.Lock()
        pieces = split(blobs, max(children + 1, -(-pack_bytes(blobs) // piece))) if apart else []
        self._pieces = deque((p, sum(blobverify.span_size(blobs, s) for s in p)) for p in pieces)
        self._total = sum(size for _, size in self._pieces)
        self._children = (
            _start_children(blobs, children, blobverify.VERIFY_CACHE // children) if apart else []
        )
        self._pool = ThreadPoolExecutor(len(self._children) + 1)
        self._passed, self._current = 0, [0] * (len(self._children) + 1)
        self._released = [threading.Event() for _ in self._children]
        # Serve each child's output as it comes (a full pipe would stall its pass).
        self._answers: list[Future[dict[str, str] | None]] = [
            self._pool.submit(self._serve, k) for k in range(len(self._children))
        ]
        if not self._children:
            self._reads = self._pool.submit(_pass, blobs, progress)

    def result(self, addresses: Iterable[str]) -> dict[str, str]:
        """The reason for each of ``addresses`` that is missing or damaged."""
        try:
            if not self._children:
                return blobverify.judge(self.blobs, addresses, self._reads.result())
            # This process's share, its bookkeeping made now: while the database scanned the events,
            # this memory held their batches.
            reads = ArrayReads(self.blobs)
            me = len(self._children)
            while (taken := self._take(me, last=True)) is not None:
                blobverify.verified_records(
                    self.blobs, reads, lambda d, _: self._show(me, d), taken, OWN_CACHE
                )
            for released in self._released:
                released.wait()  # (no child is handed a piece after this: its stdin is the addresses')
            first = self._children[0].stdin
            assert first is not None  # a pipe
            odd: list[str] = []  # (not addresses: read the ordinary way, which words them)
            blocks = addresses.blocks() if isinstance(addresses, References) else _digests(addresses, odd)
            _feed(first, (reads.unvouched_digests(block) for block in blocks))
            found = [answer.result() for answer in self._answers]
            if any(f is None for f in found):
                return blobverify.verify_many(self.blobs, list(addresses), self.progress)
            return {**(found[-1] or {}), **{a: r for a in odd if (r := self.blobs.check(a))}}
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop the pass if it still runs (``result`` was not asked for: the verify failed first)."""
        for child in self._children:
            if child.poll() is None:
                child.kill()
        self._pool.shutdown(wait=True)

    def _take(self, k: int, last: bool = False) -> list[Span] | None:
        """The next piece for ``k`` (this process takes from the end, so that the children's pieces
        stay in the order of the packs), counting the one it held as passed; None when none is left."""
        with self._lock:
            self._passed += self._current[k]
            self._current[k] = 0
            if not self._pieces:
                return None
            spans, _ = self._pieces.pop() if last else self._pieces.popleft()
            return spans

    def _show(self, k: int, done: int) -> None:
        with self._lock:
            self._current[k] = done
            if self.progress:
                self.progress(min(self._passed + sum(self._current), self._total), self._total)

    def _serve(self, k: int) -> dict[str, str] | None:
        """Child ``k``'s problems (the last child's; {} for the others): its pieces handed to it as it
        asks, its progress shown, the addresses it passes on handed to the next child; None if it
        gave no sound answer."""
        child = self._children[k]
        after = self._children[k + 1].stdin if k + 1 < len(self._children) else None
        assert child.stdout is not None and child.stdin is not None  # pipes
        result: dict[str, str] | None = None
        try:
            for line in child.stdout:
                if line.startswith(b">") and after is not None:
                    after.write(line[1:])
                    continue
                message = json.loads(line)
                if "next" in message:
                    taken = self._take(k)
                    child.stdin.write(b"done\n" if taken is None else json.dumps(taken).encode() + b"\n")
                    child.stdin.flush()
                    if taken is None:
                        self._released[k].set()
                elif "progress" in message:
                    self._show(k, message["progress"][0])
                elif "problems" in message and after is None:
                    result = message["problems"]
                elif "passed_on" in message and after is not None:
                    result = {}
        except (ValueError, TypeError, IndexError, OSError):
            result = None  # a line that is not ours, or a next child gone: trust nothing it said
        finally:
            self._released[k].set()
            if child.poll() is None and result is None:
                child.kill()
            child.wait()
            if after is not None:
                with contextlib.suppress(OSError):
                    after.close()  # the next child judges what it was handed
        return result if child.returncode == 0 else None


def _pass(blobs: BlobStore, progress: Progress | None) -> ArrayReads:
    """The pass over every pack, its bookkeeping in arrays (memory for a big store: ``blob_reads``)."""
    reads = ArrayReads(blobs)
    blobverify.verified_records(blobs, reads, progress)
    return reads


def _start_children(blobs: BlobStore, count: int, cache: int) -> list[subprocess.Popen[bytes]]:
    """``count`` children, the last of them the one that words the problems (none if one cannot be
    started: the pass then runs here)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    children: list[subprocess.Popen[bytes]] = []
    for k in range(count):
        plan = json.dumps({"cache": cache, "pass_on": k < count - 1})
        try:
            children.append(
                subprocess.Popen(
                    # (-P: amb's module, not one of the same name in the working directory)
                    [sys.executable, "-P", "-m", "replay.blob_pass", str(blobs.root), plan],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,  # a child that fails is replaced by the pass run here
                    env=env,
                )
            )
        except OSError:
            for child in children:
                child.kill()
                child.wait()
            return []
    return children


def verify_apart(
    blobs: BlobStore, addresses: Iterable[str], progress: Progress | None = None
) -> dict[str, str]:
    """``blobverify.verify_many(blobs, addresses, progress)``, computed in child processes."""
    return BlobPass(blobs, progress, True, max(children_for(pack_bytes(blobs)), 1)).result(addresses)


def _digests(addresses: Iterable[str], odd: list[str]) -> Iterator[bytes]:
    """The addresses as 32-byte digests, many at a time; those that are not addresses go to ``odd``."""
    batch: list[str] = []
    for address in addresses:
        if DIGEST_RE.match(address):
            batch.append(address[len(HASH_PREFIX) :])
        else:
            odd.append(address)
        if len(batch) == WALK:
            yield bytes.fromhex("".join(batch))
            batch = []
    yield bytes.fromhex("".join(batch))


def _feed(pipe: IO[bytes], blocks: Iterable[bytes]) -> None:
    """Blocks of digests to a child, a line of hex each, written as they come (a million of them are
    not made one string first)."""
    try:
        for block in blocks:
            if block:
                pipe.write(block.hex().encode() + b"\n")
        pipe.close()
    except (BrokenPipeError, OSError):
        pass  # the child died: its missing result says so


def _problems(blobs: BlobStore, blocks: Iterable[bytes]) -> dict[str, str]:
    """The problem with each of the blobs left unvouched for, worded by an ordinary read."""
    problems: dict[str, str] = {}
    for block in blocks:
        for i in range(0, len(block), 32):
            address = HASH_PREFIX + block[i : i + 32].hex()
            if reason := blobs.check(address):
                problems[address] = reason
    return problems


def main(root: str, plan_text: str = "{}") -> None:
    """Pieces passed over as they are handed out on stdin (until ``done``), then the addresses read
    from stdin judged: the problems written, or (``pass_on``) the addresses not vouched for passed on."""
    plan = json.loads(plan_text)
    cache = plan.get("cache", blobverify.VERIFY_CACHE)
    given, out = sys.stdin.buffer, sys.stdout

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    blobs = BlobStore(root)
    reads = ArrayReads(blobs)
    while True:
        say({"next": True})
        line = given.readline().strip()
        if not line or line == b"done":
            break
        spans = [(name, start, stop) for name, start, stop in json.loads(line)]
        blobverify.verified_records(blobs, reads, lambda d, t: say({"progress": [d, t]}), spans, cache)
    # Then the digests to judge, a line of hex per block (a line that is not: this child fails,
    # and the pass is run again by the caller).
    left = (reads.unvouched_digests(bytes.fromhex(line.decode())) for line in given if line.strip())
    if plan.get("pass_on"):
        passed = 0
        for block in left:
            if block:
                out.write(f">{block.hex()}\n")
                passed += len(block) // 32
        say({"passed_on": passed})
    else:
        say({"problems": _problems(blobs, left)})


if __name__ == "__main__":
    main(*sys.argv[1:3])
