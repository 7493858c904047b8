"""The blob store's index of sorted address prefixes answers as the dict of entries it replaced: the
later entry for an address wins (within an index, across packs, and between the entries read and
those this process appended), dropped packs are forgotten, a lookup of something that is not an
address finds nothing, and it stays right across its growth. Entries are read back from the index
files on disk, so each test writes them there as a pack writer does."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from schemas import packindex, packstore
from schemas.packindex import PackIndex


def _entries(rng: random.Random, addresses: list[str], pack: str) -> tuple[bytes, list[tuple]]:
    rows = [(a, rng.randrange(1 << 40), rng.randrange(1 << 32), rng.choice(b"zsrcd")) for a in addresses]
    raw = b"".join(packstore.ENTRY.pack(bytes.fromhex(a), o, n, c) for a, o, n, c in rows)
    return raw, [(a, packstore.Entry(pack, o, n, c)) for a, o, n, c in rows]


def _append(packs: Path, pack: str, raw: bytes) -> None:
    path = packs / (pack + packstore.IDX_SUFFIX)
    with open(path, "ab") as f:
        if f.tell() == 0:
            f.write(packstore.IDX_MAGIC)
        f.write(raw)


def test_it_answers_as_a_dict_of_the_entries_read_in_order(tmp_path):
    rng = random.Random(7)
    addresses = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(5000)]
    index, model = PackIndex(tmp_path), dict[str, packstore.Entry]()
    arrived: list[tuple[str, packstore.Entry]] = []
    for p in range(6):
        pack = f"pack-{p}"
        # Each pack: new addresses, and some already in earlier packs or twice in this one.
        chosen = addresses[p * 700 : p * 700 + 900] + rng.sample(addresses[: p * 700 + 50], 50)
        chosen += chosen[:20]
        raw, rows = _entries(rng, chosen, pack)
        _append(tmp_path, pack, raw)
        index.add(pack, raw + raw[: packstore.ENTRY.size - 1])  # a torn tail is left out
        model.update(rows)
        arrived += rows
    for i, pack in enumerate(["pack-1", "pack-4"]):
        raw, rows = _entries(rng, addresses[i * 10 : i * 10 + 5], pack)
        _append(tmp_path, pack, raw[: packstore.ENTRY.size])
        index.put(rows[0][0], rows[0][1])
        model[rows[0][0]] = rows[0][1]
        arrived.append(rows[0])
    raw, rows = _entries(rng, addresses[20:25], "pack-0")  # read after the entries put: they win
    _append(tmp_path, "pack-0", raw)
    index.add("pack-0", raw)
    model.update(rows)
    arrived += rows
    assert len(index) == len(model)
    assert set(index) == set(model)
    assert all(index.get(a) == e and a in index for a, e in model.items())
    missing = hashlib.sha256(b"never stored").hexdigest()
    for hexd in (missing, "", "zz", "ab" * 31, "ab" * 33):
        assert index.get(hexd) is None and hexd not in index
    index.drop_packs({"pack-2", "pack-5", "no-such-pack"})
    # An address whose last entry was in a dropped pack is found in the pack of its entry before.
    kept = {a: e for a, e in arrived if e.pack not in {"pack-2", "pack-5"}}
    assert set(index) == set(kept) and all(index.get(a) == e for a, e in kept.items())
    index.clear()
    assert len(index) == 0 and index.get(addresses[0]) is None


def test_entries_put_are_sorted_in_and_read_back_from_their_file(tmp_path):
    """Past the few it keeps whole, a writer's entries are found as the ones read from a file."""
    rng = random.Random(3)
    index, model = PackIndex(tmp_path), dict[str, packstore.Entry]()
    raw, rows = _entries(rng, [hashlib.sha256(b"r%d" % i).hexdigest() for i in range(3000)], "read")
    _append(tmp_path, "read", raw)
    index.add("read", raw)
    model.update(rows)
    puts = [hashlib.sha256(b"p%d" % i).hexdigest() for i in range(20000)] + [rows[5][0], rows[7][0]]
    raw, rows = _entries(rng, puts, "mine")
    _append(tmp_path, "mine", raw)
    for a, e in rows:
        index.put(a, e)
        model[a] = e
    assert len(index._recent) < len(puts)  # most are sorted in, read back from the file
    assert all(index.get(a) == e for a, e in model.items())
    assert set(index) == set(model)
    index.close()


def test_addresses_that_share_their_first_bits_are_told_apart(tmp_path):
    """Two addresses with the same sorted prefix: each lookup reads back and compares whole ones."""
    a = "ab" * 8 + "01" * 24
    b = "ab" * 8 + "02" * 24
    assert packindex._key(bytes.fromhex(a)) == packindex._key(bytes.fromhex(b))
    raw, rows = _entries(random.Random(1), [a, b], "p")
    _append(tmp_path, "p", raw)
    index = PackIndex(tmp_path)
    index.add("p", raw)
    assert index.get(a) == rows[0][1] and index.get(b) == rows[1][1]
    assert index.get("ab" * 8 + "03" * 24) is None
    index.close()


def test_an_index_file_gone_finds_nothing(tmp_path):
    raw, rows = _entries(random.Random(2), [hashlib.sha256(b"x").hexdigest()], "p")
    _append(tmp_path, "p", raw)
    index = PackIndex(tmp_path)
    index.add("p", raw)
    (tmp_path / ("p" + packstore.IDX_SUFFIX)).unlink()
    assert index.get(rows[0][0]) is None


def test_it_holds_a_few_bytes_an_entry(tmp_path):
    """The index of a big store costs the process about 8 bytes a blob (a flat table of whole
    entries took 70): a command's memory no longer grows with the store's blobs."""
    import tracemalloc

    n = 200_000
    raw = os.urandom(n * packstore.ENTRY.size)
    _append(tmp_path, "big", raw)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = PackIndex(tmp_path)
        for at in range(0, len(raw), packstore.ENTRY.size << 12):
            index.add("big", raw[at : at + (packstore.ENTRY.size << 12)])
        digest = raw[:32].hex()
        assert index.get(digest) is not None  # (sorted, as for any lookup)
        held = tracemalloc.get_traced_memory()[0] - before
        index.close()
    finally:
        tracemalloc.stop()
    assert held < 12 * n, f"{held / n:.1f} bytes an entry"
