"""The blob store's index in flat arrays answers as the dict of entries it replaced: the later
entry for an address wins (within an index and across packs), dropped packs are forgotten, a
lookup of something that is not an address finds nothing, and it stays right across its growth."""

from __future__ import annotations

import hashlib
import random

from schemas import packstore
from schemas.packindex import PackIndex


def _entries(rng: random.Random, addresses: list[str], pack: str) -> tuple[bytes, list[tuple]]:
    rows = [(a, rng.randrange(1 << 40), rng.randrange(1 << 32), rng.choice(b"zsrcd")) for a in addresses]
    raw = b"".join(packstore.ENTRY.pack(bytes.fromhex(a), o, n, c) for a, o, n, c in rows)
    return raw, [(a, packstore.Entry(pack, o, n, c)) for a, o, n, c in rows]


def test_it_answers_as_a_dict_of_the_entries_read_in_order():
    rng = random.Random(7)
    addresses = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(5000)]
    index, model = PackIndex(), dict[str, packstore.Entry]()
    for p in range(6):
        pack = f"pack-{p}"
        # Each pack: new addresses, and some already in earlier packs or twice in this one.
        chosen = addresses[p * 700 : p * 700 + 900] + rng.sample(addresses[: p * 700 + 50], 50)
        chosen += chosen[:20]
        raw, rows = _entries(rng, chosen, pack)
        index.add(pack, raw + raw[: packstore.ENTRY.size - 1])  # a torn tail is left out
        model.update(rows)
    for i, pack in enumerate(["pack-1", "pack-4"]):
        raw, rows = _entries(rng, addresses[i * 10 : i * 10 + 5], pack)
        index.put(rows[0][0], rows[0][1])
        model[rows[0][0]] = rows[0][1]
    assert len(index) == len(model)
    assert set(index) == set(model)
    assert all(index.get(a) == e and a in index for a, e in model.items())
    missing = hashlib.sha256(b"never stored").hexdigest()
    for hexd in (missing, "", "zz", "ab" * 31, "ab" * 33):
        assert index.get(hexd) is None and hexd not in index
    index.drop_packs({"pack-2", "pack-5", "no-such-pack"})
    kept = {a: e for a, e in model.items() if e.pack not in {"pack-2", "pack-5"}}
    assert set(index) == set(kept) and all(index.get(a) == e for a, e in kept.items())
    index.clear()
    assert len(index) == 0 and index.get(addresses[0]) is None
