"""bench/blobs: blobs in packs vs one loose file per blob, on the same runs, side by side.

Builds the 200-run set once, keeps a copy of it with one zlib file per blob, and measures both,
alternating --rounds rounds (medians), everything in the page cache: ``amb verify`` and its blob
check alone, a blob read, the blobs' bytes and files on disk, ``amb blobs migrate`` of the loose
copy, and the codecs on the store's small bodies. How to read them: docs/blob-packs.md.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

import zstandard

from bench import figures
from bench.measure import BLOB_REFS, alternate, disk_bytes, percentile, read_through, timed, workdir
from recorder.synthetic import generate_run
from replay.blob_migrate import migrate
from replay.ingest import ingest
from replay.store import Store
from replay.verify import check_blobs, verify
from schemas import blobcodec
from schemas.blobstore import BlobStore
from tests.fakes.old_store import explode


def build(root: Path, runs: int, calls: int) -> None:
    for i in range(runs):
        generate_run(root, f"run-{i:04d}", seed=i, calls=calls)
    BlobStore(root / "blobs").close()
    ingest(root)


def timed_verify(root: Path) -> dict[str, float]:
    """``amb verify`` of the store, and its blob check alone, each from a cold blob index."""
    read_through((root / "blobs").rglob("*"))
    with Store.open(root, read_only=True) as st:
        st.blobs.forget()
        problems, whole = timed(lambda: verify(st.con, st.blobs))
        assert not problems, problems[:3]
        st.blobs.forget()
        _, blobs_only = timed(lambda: check_blobs(st.con, st.blobs))
    return {"verify": whole, "verify_blobs": blobs_only}


def store_round(root: Path, sample: list[str]) -> dict[str, float]:
    return timed_verify(root) | read_latency(root, sample)


def read_latency(root: Path, sample: list[str]) -> dict[str, float]:
    """A blob read's p50 and p99 (µs) over ``sample``."""
    blobs = BlobStore(root / "blobs")
    blobs.forget()
    blobs.get(sample[0])  # the index is read once per process, not per blob
    times = [timed(partial(blobs.get, address))[1] * 1e6 for address in sample]
    return {"p50": percentile(times, 50), "p99": percentile(times, 99)}


def codecs(root: Path, refs: list[str]) -> dict[str, tuple[float, float, float]]:
    """Each codec's stored share of the content and its compress and decompress seconds."""
    blobs = BlobStore(root / "blobs")
    bodies: list[bytes | bytearray | memoryview] = [
        b for b in (blobs.get(r) for r in refs) if len(b) <= 32 * 1024 and not blobcodec.looks_compressed(b)
    ]
    random.Random(0).shuffle(bodies)
    train, test = bodies[: len(bodies) // 5], bodies[len(bodies) // 5 :]
    content = sum(len(b) for b in test)
    dictionary = zstandard.train_dictionary(64 * 1024, train)
    plain = zstandard.ZstdCompressor(level=3)
    with_dict = zstandard.ZstdCompressor(level=3, dict_data=dictionary)
    d_plain, d_dict = zstandard.ZstdDecompressor(), zstandard.ZstdDecompressor(dict_data=dictionary)
    ways: list[tuple[str, Callable[[Any], bytes], Callable[[bytes], bytes]]] = [
        ("zlib-3", lambda b: zlib.compress(b, 3), zlib.decompress),
        ("zstd-3", plain.compress, d_plain.decompress),
        ("zstd-3 + 64 KiB dictionary", with_dict.compress, d_dict.decompress),
    ]

    def costs(comp: Callable[[Any], bytes], decomp: Callable[[bytes], bytes]) -> tuple[float, float, float]:
        stored, c = timed(lambda: [comp(b) for b in test])
        _, d = timed(lambda: [decomp(s) for s in stored])
        return sum(len(s) for s in stored) / content, c, d

    return {name: costs(comp, decomp) for name, comp, decomp in ways}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", metavar="DIR", help="keep the two stores in this directory (reused next time)")
    figures.add_argument(ap, "blobs")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    with workdir(args.keep, "amb-bench-blobs-") as work:
        run(args, work, figs)
    figs.write()


def migrated(loose: Path, work: Path) -> tuple[int, float]:
    """``amb blobs migrate`` of a copy of the loose store: the files it packed, and its seconds."""
    copy = work / "migrated"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(loose, copy)
    read_through((copy / "blobs").rglob("*"))
    blobs = BlobStore(copy / "blobs")
    n_loose = len(list(blobs.loose_files()))
    done, seconds = timed(lambda: migrate(blobs))
    assert not done.bad, done.bad[:3]
    blobs.close()
    shutil.rmtree(copy)
    return n_loose, seconds


def run(args: argparse.Namespace, work: Path, figs: figures.Figures) -> None:
    packed, loose = work / "packed", work / "loose"
    if not (packed / "amb.duckdb").exists():
        shutil.rmtree(packed, ignore_errors=True)
        print(f"generating {args.runs} runs of {args.calls} calls ...", file=sys.stderr)
        build(packed, args.runs, args.calls)
    if not (loose / "amb.duckdb").exists():
        shutil.rmtree(loose, ignore_errors=True)
        shutil.copytree(packed, loose)
        explode(BlobStore(loose / "blobs"))
    n_loose, migrate_s = migrated(loose, work)
    with Store.open(packed, read_only=True) as st:
        refs = sorted({r[0] for r in st.con.execute(BLOB_REFS).fetchall()})
        events = st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    sample = random.Random(1).sample(refs, min(2000, len(refs)))
    stores = {"loose": loose, "packs": packed}
    rounds = alternate(
        {name: partial(store_round, root, sample) for name, root in stores.items()}, args.rounds
    )
    loose_, packs = (
        {k: statistics.median(r[k] for r in rounds[name]) for k in rounds[name][0]} for name in stores
    )
    (ld, lf), (pd, pf) = (blob_files(root) for root in (loose, packed))
    figs.add(
        "verify",
        f"`amb verify`, {args.runs} runs × {args.calls} calls ({events:,} events, "
        f"{len(refs):,} blobs) in packs",
        f"{packs['verify']:.2f} s (its blob check {packs['verify_blobs']:.2f} s), median of {args.rounds}",
        f"one file per blob: {loose_['verify']:.2f} s ({figures.faster(packs['verify'], loose_['verify'])})",
    )
    figs.add(
        "read",
        "a blob read from packs (random referenced blobs), p50 / p99",
        f"{packs['p50']:.0f} / {packs['p99']:.0f} µs",
        f"one file per blob: {loose_['p50']:.0f} / {loose_['p99']:.0f} µs",
    )
    figs.add(
        "disk",
        "blobs on disk in packs (allocated blocks)",
        f"{pd / events:,.0f} bytes per event ({pd / 1e6:.1f} MB in {pf:,} files)",
        f"one file per blob: {ld / events:,.0f} ({ld / 1e6:.1f} MB in {lf:,} files): {ld / pd:.1f}×",
    )
    figs.add(
        "migrate",
        "`amb blobs migrate` of the one-file-per-blob copy",
        f"{n_loose / migrate_s:,.0f} blobs/s ({n_loose:,} files in {migrate_s:.1f} s)",
    )
    codec = codecs(packed, refs)
    share, comp_s, decomp_s = codec["zstd-3"]
    zlib_, dict_ = codec["zlib-3"], codec["zstd-3 + 64 KiB dictionary"]
    figs.add(
        "codec",
        "zstd level 3 on the store's small bodies "
        "([codecs](docs/blob-packs.md#compression-that-fits-the-content))",
        f"{share:.3f} of the content; {comp_s:.2f} s to compress, {decomp_s:.2f} s to decompress",
        f"zlib-3: {zlib_[0]:.3f}, {zlib_[1]:.2f} s, {zlib_[2]:.2f} s; with a trained dictionary: "
        f"{dict_[0]:.3f}, {dict_[1]:.2f} s, {dict_[2]:.2f} s",
    )


def blob_files(root: Path) -> tuple[int, int]:
    """The bytes the store's blobs take on disk, and their files."""
    return disk_bytes(root / "blobs"), sum(1 for p in (root / "blobs").rglob("*") if p.is_file())


if __name__ == "__main__":
    main()
