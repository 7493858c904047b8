"""A disk that fills up under a command: one line naming the file it could not write, a non-zero
exit, and a store that takes the same command again once there is room.

The full disk is a small tmpfs mounted in a mount namespace of the test's own (``unshare``), so
nothing outside the test sees it; the store, the Parquet export and the checkout are written there.
"""

from __future__ import annotations

import subprocess

from tests.amb.conftest import AMB

# Each command's stderr and exit code go to files outside the small disk, for the asserts below.
SCRIPT = r"""
set -eu
amb=$1 disk=$2 out=$3
mount -t tmpfs -o size=16m tmpfs "$disk"
store=$disk/store
"$amb" generate --store "$store" --runs 3 >/dev/null
"$amb" ingest --store "$store" >/dev/null
"$amb" generate --store "$store" --runs 6 --seed 100 >/dev/null
dd if=/dev/zero of="$disk/filler" bs=1M 2>/dev/null || true
try() {
    name=$1; shift
    set +e; "$amb" "$@" >/dev/null 2>"$out/$name.err"; echo $? >"$out/$name.rc"; set -e
}
try ingest ingest --store "$store"
try score score --all --judge offline --store "$store"
try export export parquet --store "$store" "$disk/parquet"
try checkout checkout --store "$store" synth-0000 "$disk/checkout"
rm "$disk/filler"
try ingest-again ingest --store "$store"
try verify verify --store "$store"
try score-again score --all --judge offline --store "$store"
ls -A "$disk" >"$out/left"
"""


def test_a_full_disk_is_one_line_and_the_store_takes_the_command_again(tmp_path):
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRIPT, "sh", AMB]
    argv += [str(disk), str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    def said(name: str) -> tuple[int, str]:
        return int((out / f"{name}.rc").read_text()), (out / f"{name}.err").read_text()

    wrote = {
        "ingest": "amb.duckdb.wal",
        "score": "amb.duckdb",
        "export": "parquet/",
        "checkout": "checkout/",
    }
    for name, file in wrote.items():
        code, err = said(name)
        lines = err.splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("amb: error: "), (name, err)
        assert "No space left on device" in err and file in err, (name, err)
        assert "no transaction is active" not in err, (name, err)
    # The export's and the checkout's half-written folders are gone with their failure.
    assert (out / "left").read_text().split() == ["store"]
    for name in ("ingest-again", "verify", "score-again"):
        code, err = said(name)
        assert code == 0, (name, err)
