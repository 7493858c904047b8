"""bench/storage_where: where a store's bytes on disk are, per event.

Reads one ingested store and attributes every byte to what it holds:

- blobs: every pack record by what refers to it (the event kind, the payload field and the media
  type of the reference; a chunk counts for the first blob whose list names it), split into its
  stored content, its record header and its index entry; records no event refers to are
  ``unreferenced``;
- the database: each column of ``events`` by the bytes of its storage segments (DuckDB's
  ``pragma_storage_info``; the file's own blocks beside);
- spools: by what their names end with (``.spool``, ``.spool.zst``, ``.blobs``, ...);
- with ``--dictionary``, what a trained zstd dictionary would save on the model-call bodies beside
  what their records take now (``dictionary_savings``).

Run: python bench/storage_where.py STORE [--json] [--dictionary]
     (STORE is an ingested store, e.g. one ``./just bench storage --keep DIR`` left)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zstandard

from bench.measure import disk_bytes
from schemas import blobcodec, blobstore, packstore

DICTIONARY_BYTES = 64 * 1024
DICTIONARY_WAYS = ("content", "stored now", "zstd-3", "zstd-3 + dictionary")

_REF = re.compile(r'"(\w+)":\{"blob":"sha256:([0-9a-f]{64})","media_type":"([^"]*)"')
_CHUNK = re.compile(rb"sha256:([0-9a-f]{64})")


def first_value(con: Any, sql: str) -> Any:
    row = con.execute(sql).fetchone()
    assert row is not None, sql  # an aggregate or a pragma: always one row
    return row[0]


def where(store: Path) -> dict[str, Any]:
    import duckdb

    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    events = first_value(con, "SELECT count(*) FROM events")
    owner: dict[str, str] = {}
    with_blobs = "SELECT kind, payload FROM events WHERE payload LIKE '%\"blob\":%'"
    for kind, payload in con.execute(with_blobs).fetchall():
        for field, hexd, media in _REF.findall(payload):
            owner.setdefault(hexd, f"{kind}.{field} ({media})")
    columns: dict[str, int] = defaultdict(int)
    block = first_value(con, "SELECT block_size FROM pragma_database_size()")
    for (column,) in con.execute("SELECT DISTINCT column_name FROM pragma_storage_info('events')").fetchall():
        columns[column] = 0
    # Segment sizes: a persistent segment's bytes are not listed; its block share is. Count, per
    # column, the distinct (block_id, block_offset) pairs weighted by the segment's share.
    rows = con.execute(
        "SELECT column_name, block_id, block_offset "
        "FROM pragma_storage_info('events') WHERE persistent ORDER BY block_id, block_offset"
    ).fetchall()
    by_block: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for column, block_id, offset in rows:
        by_block[block_id].append((offset, column))
    for segs in by_block.values():
        segs.sort()
        for i, (offset, column) in enumerate(segs):
            end = segs[i + 1][0] if i + 1 < len(segs) else block
            columns[column] += end - offset
    con.close()

    area: dict[str, Counter[str]] = defaultdict(Counter)
    packs = store / "blobs" / blobstore.PACKS
    records: dict[str, tuple[int, int, int]] = {}  # hexd -> (codec, stored, header)
    listing: dict[str, list[str]] = {}
    for pack in sorted(packs.glob("*" + packstore.PACK_SUFFIX)):
        for rec in packstore.scan(pack):
            header = rec.length - len(rec.stored)
            records.setdefault(rec.hexd, (rec.codec, len(rec.stored), header))
            if rec.codec == blobcodec.CHUNKS:
                listing[rec.hexd] = [m.decode() for m in _CHUNK.findall(rec.stored)]
    for hexd, chunks in listing.items():
        for c in chunks:
            if hexd in owner:
                owner.setdefault(c, owner[hexd] + " [chunk]")
    for hexd, (codec, stored, header) in records.items():
        what = owner.get(hexd, "unreferenced")
        if codec == blobcodec.CHUNKS:
            what += " [list]"
        area[what].update(records=1, stored=stored, headers=header, index=packstore.ENTRY.size)
    spools: dict[str, int] = defaultdict(int)
    for path in (store / "spool").rglob("*"):
        if path.is_file():
            suffix = "".join(path.suffixes) or path.name
            spools[suffix] += disk_bytes(path)
    return {
        "events": events,
        "db_disk": disk_bytes(store / "amb.duckdb"),
        "db_columns": dict(columns),
        "blob_disk": disk_bytes(store / "blobs"),
        "blobs": {k: dict(v) for k, v in sorted(area.items())},
        "spools": dict(spools),
    }


def show(w: dict[str, Any]) -> None:
    n = w["events"]
    per = lambda b: b / n  # noqa: E731 (a one-line helper for the table)
    total = w["db_disk"] + w["blob_disk"] + sum(w["spools"].values())
    print(f"{n} events; on disk {total} bytes = {per(total):.0f} bytes per event")
    print(f"\ndatabase: {per(w['db_disk']):.0f} bytes per event (the file); columns of events:")
    for column, b in sorted(w["db_columns"].items(), key=lambda kv: -kv[1]):
        print(f"  {column:24} {per(b):7.1f}")
    print(f"\nblobs: {per(w['blob_disk']):.0f} bytes per event (files); records by referrer:")
    print(f"  {'what':64} {'records':>8} {'stored':>7} {'headers':>7} {'index':>7}")
    tot: dict[str, float] = defaultdict(float)
    for what, a in sorted(w["blobs"].items(), key=lambda kv: -kv[1]["stored"]):
        print(
            f"  {what:64} {a['records']:8d} {per(a['stored']):7.1f} {per(a['headers']):7.1f} "
            f"{per(a['index']):7.1f}"
        )
        for k in ("stored", "headers", "index"):
            tot[k] += a[k]
    total = f"{per(tot['stored']):7.1f} {per(tot['headers']):7.1f} {per(tot['index']):7.1f}"
    print(f"  {'total':64} {'':8} {total}")
    print("\nspools (on disk):")
    for suffix, b in sorted(w["spools"].items()):
        print(f"  {suffix:24} {per(b):7.1f}")


def dictionary_savings(store: Path) -> dict[str, object]:
    """What a trained zstd dictionary would save on the model-call bodies, beside their records now.

    The bodies are the request and response blobs of ``model_calls``. The runs are split in two
    (by run id, sorted): a 64 KiB dictionary is trained on the first half's bodies, and every body
    of the second half is measured four ways: its content, its pack record now (delta, zstd or
    zlib, header included; a chunk list counts only its list, not its chunks), zstd level 3 alone,
    and zstd level 3 with the dictionary. Splitting by
    run keeps a body's own run out of its dictionary; runs of one task by one scripted agent still
    share most of their text, which flatters a dictionary (docs/blob-packs.md)."""
    from replay.store import Store
    from schemas.blob import HASH_PREFIX

    with Store.open(store, read_only=True) as st:
        rows = st.con.execute("SELECT run_id, request_blob, response_blob FROM model_calls").fetchall()
        owner: dict[str, tuple[str, str]] = {}
        for run, request, response in rows:
            for side, blob in (("request", request), ("response", response)):
                if blob:
                    owner.setdefault(blob[len(HASH_PREFIX) :], (run, side))
        record_bytes = {
            rec.hexd: rec.length
            for pack in st.blobs.pack_files()
            for rec in packstore.scan(pack)
            if rec.hexd in owner
        }
        content = {h: st.blobs.get(HASH_PREFIX + h) for h in record_bytes}
    runs = sorted({run for run, _ in owner.values()})
    trained_on = set(runs[: len(runs) // 2])
    train: list[bytes | bytearray | memoryview] = [content[h] for h in content if owner[h][0] in trained_on]
    if len(train) < 8:
        raise SystemExit(f"bench: {store}: {len(train)} bodies to train on; a dictionary needs more runs")
    dictionary = zstandard.train_dictionary(DICTIONARY_BYTES, train)
    plain = zstandard.ZstdCompressor(level=3)
    with_dictionary = zstandard.ZstdCompressor(level=3, dict_data=dictionary)
    sums: dict[str, Counter[str]] = {"request": Counter(), "response": Counter()}
    for h, data in content.items():
        run, side = owner[h]
        if run in trained_on:
            continue
        sums[side].update(
            {
                "bodies": 1,
                "content": len(data),
                "stored now": record_bytes[h],
                "zstd-3": len(plain.compress(data)),
                "zstd-3 + dictionary": len(with_dictionary.compress(data)),
            }
        )
    return {
        "runs": len(runs),
        "trained_on_runs": len(trained_on),
        "trained_on_bodies": len(train),
        "measured": {side: dict(c) for side, c in sums.items()},
    }


def show_dictionary(result: dict[str, Any]) -> None:
    measured, trained = result["runs"] - result["trained_on_runs"], result["trained_on_runs"]
    print(
        f"\nmodel-call bodies of {measured} runs, a dictionary trained on {result['trained_on_bodies']}"
        f" bodies of the other {trained} (bytes, and of the content):"
    )
    print(f"  {'':10}{'bodies':>8}" + "".join(f"{w:>22}" for w in DICTIONARY_WAYS))
    for side, c in result["measured"].items():
        base = c.get("content") or 1
        cells = "".join(f"{c.get(w, 0):>13,} ({c.get(w, 0) / base:.3f})" for w in DICTIONARY_WAYS)
        print(f"  {side:10}{c.get('bodies', 0):>8}{cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--dictionary",
        action="store_true",
        help="also: what a trained zstd dictionary would save on the model-call bodies",
    )
    args = ap.parse_args()
    w = where(args.store)
    if args.dictionary:
        w["dictionary"] = dictionary_savings(args.store)
    if args.json:
        print(json.dumps(w, indent=1))
        return
    show(w)
    if args.dictionary:
        show_dictionary(w["dictionary"])


if __name__ == "__main__":
    main()
