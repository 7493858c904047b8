"""bench/blobs: blobs in packs vs one loose file per blob, on the same runs, side by side.

Builds the store's reference 200-run set (``amb generate --runs 200 --calls 50``, then ingest) once, keeps
a second copy whose blobs are laid out as before packs (one zlib file per blob, ``blobs/ab/cd...``),
and prints for both, alternating --rounds rounds (medians), everything in the page cache:

- ``amb verify`` (events, chains, manifests and every referenced blob) and its blob part alone;
- a blob read (random referenced blobs, one ``get`` each: p50 and p99);
- on-disk bytes of the blobs (allocated blocks, what ``du`` counts) and files;
- ``amb blobs migrate`` of the loose copy (time, blobs per second);
- codecs on the store's small JSON bodies: zlib-3 (what loose files hold), zstd-3, and zstd-3
  with a dictionary trained on a sample of other bodies (stored bytes, compress and decompress
  time), so the choice of codec is a measured one.

Run: ./just bench blobs [--runs 200] [--calls 50] [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

import zstandard

from bench import figures
from bench.measure import read_through, timed, workdir
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


def timed_verify(root: Path) -> tuple[float, float, int]:
    with Store.open(root, read_only=True) as st:
        st.blobs.forget()
        problems, whole = timed(lambda: verify(st.con, st.blobs))
        assert not problems, problems[:3]
        st.blobs.forget()
        _, blobs_only = timed(lambda: check_blobs(st.con, st.blobs))
        n = st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    return whole, blobs_only, n


def referenced(root: Path) -> list[str]:
    with Store.open(root, read_only=True) as st:
        rows = st.con.execute(
            r"""SELECT DISTINCT unnest(regexp_extract_all(payload, '"blob":"(sha256:[0-9a-f]{64})"', 1))
                FROM events"""
        ).fetchall()
    return sorted(r[0] for r in rows)


def read_latency(root: Path, sample: list[str]) -> tuple[float, float]:
    blobs = BlobStore(root / "blobs")
    blobs.forget()
    blobs.get(sample[0])  # the index is read once per process, not per blob
    times = sorted(timed(partial(blobs.get, address))[1] for address in sample)
    return times[len(times) // 2] * 1e6, times[int(len(times) * 0.99)] * 1e6


def du(root: Path) -> tuple[int, int]:
    disk = files = 0
    for path in (root / "blobs").rglob("*"):
        if path.is_file():
            disk += path.stat().st_blocks * 512
            files += 1
    return disk, files


def codecs(root: Path, refs: list[str]) -> dict[str, tuple[float, float, float]]:
    """Each codec's stored share of the content and its compress and decompress seconds."""
    blobs = BlobStore(root / "blobs")
    bodies: list[bytes | bytearray | memoryview] = [
        b for b in (blobs.get(r) for r in refs) if len(b) <= 32 * 1024 and not blobcodec.looks_compressed(b)
    ]
    rng = random.Random(0)
    rng.shuffle(bodies)
    train, test = bodies[: len(bodies) // 5], bodies[len(bodies) // 5 :]
    content = sum(len(b) for b in test)
    dictionary = zstandard.train_dictionary(64 * 1024, train)
    plain = zstandard.ZstdCompressor(level=3)
    with_dict = zstandard.ZstdCompressor(level=3, dict_data=dictionary)
    d_plain, d_dict = zstandard.ZstdDecompressor(), zstandard.ZstdDecompressor(dict_data=dictionary)
    rows: list[tuple[str, Callable[[Any], bytes], Callable[[bytes], bytes]]] = [
        ("zlib-3", lambda b: zlib.compress(b, 3), zlib.decompress),
        ("zstd-3", plain.compress, d_plain.decompress),
        ("zstd-3 + 64 KiB dictionary", with_dict.compress, d_dict.decompress),
    ]
    print(
        f"codecs on {len(test):,} small bodies ({content:,} bytes; "
        f"dictionary trained on {len(train):,} others):"
    )
    measured: dict[str, tuple[float, float, float]] = {}
    for name, comp, decomp in rows:
        t0 = time.perf_counter()
        stored = [comp(b) for b in test]
        c = time.perf_counter() - t0
        t0 = time.perf_counter()
        for s in stored:
            decomp(s)
        d = time.perf_counter() - t0
        size = sum(len(s) for s in stored)
        print(
            f"  {name:28s} {size:>12,} bytes ({size / content:.3f} of content)  compress {c * 1e3:6.0f} ms"
            f"  decompress {d * 1e3:5.0f} ms"
        )
        measured[name] = (size / content, c, d)
    return measured


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
        measure(args, work, figs)
    figs.write()


def measure(args: argparse.Namespace, work: Path, figs: figures.Figures) -> None:
    packed, loose = work / "packed", work / "loose"
    if not (packed / "amb.duckdb").exists():
        shutil.rmtree(packed, ignore_errors=True)
        print(f"generating {args.runs} runs of {args.calls} calls ...", file=sys.stderr)
        _, build_s = timed(lambda: build(packed, args.runs, args.calls))
        print(f"  built {args.runs} runs in {build_s:.0f} s", file=sys.stderr)
    if not (loose / "amb.duckdb").exists():
        shutil.rmtree(loose, ignore_errors=True)
        shutil.copytree(packed, loose)
        explode(BlobStore(loose / "blobs"))
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")

    migrated = work / "migrated"
    shutil.rmtree(migrated, ignore_errors=True)
    shutil.copytree(loose, migrated)
    read_through((migrated / "blobs").rglob("*"))
    mblobs = BlobStore(migrated / "blobs")
    n_loose = len(list(mblobs.loose_files()))
    done, migrate_s = timed(lambda: migrate(mblobs))
    assert not done.bad, done.bad[:3]
    mblobs.close()
    shutil.rmtree(migrated)

    refs = referenced(packed)
    sample = random.Random(1).sample(refs, min(2000, len(refs)))
    results: dict[str, dict[str, list[float]]] = {"loose": {}, "packs": {}}
    events = 0
    for i in range(args.rounds):
        for name, root in (("loose", loose), ("packs", packed)):
            read_through((root / "blobs").rglob("*"))
            whole, blobs_only, events = timed_verify(root)
            p50, p99 = read_latency(root, sample)
            r = results[name]
            for key, value in (("verify", whole), ("verify_blobs", blobs_only), ("p50", p50), ("p99", p99)):
                r.setdefault(key, []).append(value)
        print(
            f"  round {i + 1}/{args.rounds}: verify loose {results['loose']['verify'][-1]:.2f} s, "
            f"packs {results['packs']['verify'][-1]:.2f} s",
            file=sys.stderr,
        )
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    (ld, lf), (pd, pf) = du(loose), du(packed)
    print(f"store: {args.runs} runs, {events:,} events, {len(refs):,} referenced blobs")
    print(f"{'':34s}{'loose files':>14s}{'packs':>14s}{'ratio':>9s}")

    def row(label: str, a: float, b: float, unit: str, fmt: str = "{:.2f}") -> None:
        print(f"{label:34s}{fmt.format(a) + unit:>14s}{fmt.format(b) + unit:>14s}{a / b:>8.1f}x")

    row("amb verify (median)", med["loose"]["verify"], med["packs"]["verify"], " s")
    row("  of which blobs", med["loose"]["verify_blobs"], med["packs"]["verify_blobs"], " s")
    row("blob read p50", med["loose"]["p50"], med["packs"]["p50"], " us", "{:.0f}")
    row("blob read p99", med["loose"]["p99"], med["packs"]["p99"], " us", "{:.0f}")
    row("blobs on disk", ld / 1e6, pd / 1e6, " MB", "{:.1f}")
    row("blob files", lf, pf, "", "{:,.0f}")
    row("on-disk blob bytes per event", ld / events, pd / events, "", "{:,.0f}")
    print(
        f"amb blobs migrate of the loose copy: {n_loose:,} files in {migrate_s:.1f} s "
        f"({n_loose / migrate_s:,.0f}/s)"
    )
    codec = codecs(packed, refs)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    loose_, packs = med["loose"], med["packs"]
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


if __name__ == "__main__":
    main()
