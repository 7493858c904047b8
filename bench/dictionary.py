"""bench/dictionary: what a trained zstd dictionary would save on a store's model-call bodies,
beside what the store keeps for them now.

The bodies are the request and response blobs of ``model_calls``. The runs are split in two (by
run id, sorted): a 64 KiB dictionary is trained on the first half's bodies and every body of the
second half is measured four ways: its content, its pack record now (delta, zstd or zlib, header
included), zstd level 3 alone, and zstd level 3 with the dictionary. Splitting by run keeps a
body's own run out of its dictionary; runs of one task by one scripted agent still share most of
their text, which flatters a dictionary (docs/blob-packs.md: measure it on real traffic).

Run: python bench/dictionary.py STORE [--json]
     (STORE is an ingested store: ``out/demo-store`` after ``./just demo``, or a store of real runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

import zstandard  # noqa: E402 (after the path, with the checkout's packages)

from replay.store import Store  # noqa: E402
from schemas import packstore  # noqa: E402
from schemas.blob import HASH_PREFIX  # noqa: E402

DICTIONARY_BYTES = 64 * 1024
WAYS = ("content", "stored now", "zstd-3", "zstd-3 + dictionary")


def measure(store: Path) -> dict[str, object]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args.store)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['runs']} runs; dictionary trained on {result['trained_on_bodies']} bodies of "
        f"{result['trained_on_runs']} runs, measured on the others' bodies"
    )
    print(f"{'':10}{'bodies':>8}" + "".join(f"{w:>22}" for w in WAYS))
    measured: dict[str, dict[str, int]] = result["measured"]  # type: ignore[assignment]  # built above
    for side, c in measured.items():
        base = c.get("content") or 1
        cells = "".join(f"{c.get(w, 0):>13,} ({c.get(w, 0) / base:.3f})" for w in WAYS)
        print(f"{side:10}{c.get('bodies', 0):>8}{cells}")


if __name__ == "__main__":
    main()
