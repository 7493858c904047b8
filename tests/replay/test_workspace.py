"""`amb checkout` and `amb files`: the workspace at any moment, from file events written through
the real spool path and ingested into a real store; hostile paths and tampered blobs."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zlib
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from amb.live_cmds import _run_events, _workspace
from amb.main import cli
from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from replay.store import Store
from replay.web.workspace import tar_at
from replay.workspace import checkout
from schemas.blobstore import BlobStore
from schemas.events import (
    FileDeleted,
    FileRenamed,
    FileWritten,
    ModelCallCompleted,
    RunFinished,
    RunStarted,
    SubmissionSealed,
    ToolCallResult,
)
from schemas.ostext import os_text
from tests.fakes.blob_tamper import replace_blob

T0 = 1_800_000_000_000_000_000
S = 1_000_000_000


def _write(blobs: BlobStore, path: str, data: bytes, changed_ns: int | None = None, op: str = "created"):
    ref = blobs.put(data)
    return FileWritten(path=path, op=op, size=len(data), sha256=ref.blob, content=ref, changed_ns=changed_ns)


def _run(root: Path, run_id: str, shim_events: list, proxy_events: list | None = None) -> None:
    """A run: recorder start/finish, the given shim events (payload, ts) and proxy events."""
    blobs = BlobStore(root / "blobs")
    with SpoolWriter(spool_path(root, run_id, "recorder"), run_id, "recorder") as rec:
        rec.append(RunStarted(agent="t", workspace="/w"), ts_ns=T0)
        with SpoolWriter(spool_path(root, run_id, "shim"), run_id, "shim") as shim:
            for payload, ts in shim_events:
                shim.append(payload(blobs) if callable(payload) else payload, ts_ns=ts)
        if proxy_events:
            with SpoolWriter(spool_path(root, run_id, "proxy"), run_id, "proxy") as proxy:
                for payload, ts in proxy_events:
                    proxy.append(payload, ts_ns=ts)
        rec.append(SubmissionSealed(root="/w"), ts_ns=T0 + 100 * S)
        rec.append(RunFinished(status="completed", exit_code=0), ts_ns=T0 + 101 * S)
    ingest(root)


def _amb(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_every_moment_of_writes_rewrites_renames_and_deletes(tmp_path):
    root = tmp_path / "store"
    shim = [
        (lambda b: _write(b, "plan.md", b"v1"), T0 + 1 * S),  # shim:0
        (lambda b: _write(b, "plan.md", b"version two", op="modified"), T0 + 2 * S),  # 1
        (FileRenamed(src="plan.md", dst="notes/plan.md"), T0 + 3 * S),  # 2
        (lambda b: _write(b, "out/a/x.txt", b"x"), T0 + 4 * S),  # 3
        (lambda b: _write(b, "out/b.txt", b"b"), T0 + 4 * S),  # 4
        (FileRenamed(src="out", dst="final"), T0 + 5 * S),  # 5: a directory
        (FileDeleted(path="notes/plan.md"), T0 + 6 * S),  # 6
        (lambda b: _write(b, "final/b.txt", b"bb", op="modified"), T0 + 7 * S),  # 7
    ]
    _run(root, "r1", shim)
    expected = [
        {"plan.md": b"v1"},
        {"plan.md": b"version two"},
        {"notes/plan.md": b"version two"},
        {"notes/plan.md": b"version two", "out/a/x.txt": b"x"},
        {"notes/plan.md": b"version two", "out/a/x.txt": b"x", "out/b.txt": b"b"},
        {"notes/plan.md": b"version two", "final/a/x.txt": b"x", "final/b.txt": b"b"},
        {"final/a/x.txt": b"x", "final/b.txt": b"b"},
        {"final/a/x.txt": b"x", "final/b.txt": b"bb"},
    ]
    events, blobs, _ = _run_events(str(root), "r1")
    for seq, want in enumerate(expected):
        # The library behind the command (one store read for every moment), then the command.
        out = tmp_path / f"at-{seq}"
        checkout(_workspace(str(root), "r1", f"shim:{seq}", events), blobs, out)
        assert _tree(out) == want, seq
        if seq != 3:  # shim:3 and shim:4 were observed at the same time
            by_time = tmp_path / f"time-{seq}"
            ts = T0 + (seq + 1 - (seq >= 4)) * S + S // 2
            checkout(_workspace(str(root), "r1", "time:" + _iso(ts), events), blobs, by_time)
            assert _tree(by_time) == want, seq
    code, text = _amb("checkout", "r1", str(tmp_path / "cli-5"), "--at", "shim:5", "--store", str(root))
    assert code == 0 and _tree(tmp_path / "cli-5") == expected[5], text
    code, text = _amb(
        "checkout", "r1", str(tmp_path / "cli-t"), "--time", _iso(T0 + 3 * S), "--store", str(root)
    )
    assert code == 0 and _tree(tmp_path / "cli-t") == expected[2], text
    code, text = _amb("checkout", "r1", str(tmp_path / "end"), "--before-submit", "--store", str(root))
    assert code == 0 and _tree(tmp_path / "end") == expected[-1], text
    code, text = _amb("files", "r1", "--diff", "shim:1", "shim:7", "--json", "--store", str(root))
    assert code == 0, text
    changes = {(c["change"], c["path"]) for c in json.loads(text)["changes"]}
    assert changes == {("removed", "plan.md"), ("added", "final/a/x.txt"), ("added", "final/b.txt")}
    code, text = _amb("files", "r1", "--diff", "shim:0", "shim:2", "--json", "--store", str(root))
    rows = json.loads(text)["changes"]
    assert [(r["change"], r["path"]) for r in rows] == [("added", "notes/plan.md"), ("removed", "plan.md")]
    code, text = _amb("files", "r1", "--diff", "shim:1", "shim:2", "--json", "--store", str(root))
    rows = json.loads(text)["changes"]
    assert [(r["change"], r["path"], r["from"]) for r in rows] == [("renamed", "notes/plan.md", "plan.md")]


def _iso(ns: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()


def test_steps_use_the_kernel_time_of_changes_not_when_the_shim_saw_them(tmp_path):
    """The shim saw the write after the next model call began; its ctime says it came before."""
    root = tmp_path / "store"
    shim = [
        (lambda b: _write(b, "a.txt", b"step one", changed_ns=T0 + 1 * S), T0 + 3 * S),
        (lambda b: _write(b, "a.txt", b"step two", changed_ns=T0 + 4 * S, op="modified"), T0 + 4 * S),
    ]
    proxy = [
        (ModelCallCompleted(call_id="c1", provider="openai", api="chat.completions", started_ns=T0), T0),
        (
            ModelCallCompleted(
                call_id="c2", provider="openai", api="chat.completions", started_ns=T0 + 2 * S
            ),
            T0 + 2 * S + 5,
        ),
        (ToolCallResult(tool_call_id="t1", model_call_id="c2"), T0 + 2 * S + 6),
        (
            ModelCallCompleted(
                call_id="c3", provider="openai", api="chat.completions", started_ns=T0 + 5 * S
            ),
            T0 + 5 * S + 5,
        ),
        (ToolCallResult(tool_call_id="t2", model_call_id="c3"), T0 + 5 * S + 6),
    ]
    _run(root, "r2", shim, proxy)
    for step, want in ((1, b"step one"), (2, b"step two")):
        out = tmp_path / f"step-{step}"
        code, text = _amb("checkout", "r2", str(out), "--step", str(step), "--store", str(root))
        assert code == 0, text
        assert _tree(out) == {"a.txt": want}
    code, text = _amb("checkout", "r2", str(tmp_path / "x"), "--step", "3", "--store", str(root))
    assert code == 2 and "amb: error: step 3: the run has 2 tool call result(s)" in text


def test_a_file_above_the_cap_is_listed_with_its_hash_never_silently_missing(tmp_path):
    root = tmp_path / "store"
    big = FileWritten(path="model.bin", size=10**9, sha256="sha256:" + "ab" * 32, content=None)
    _run(root, "r3", [(big, T0 + S), (lambda b: _write(b, "small.txt", b"s"), T0 + 2 * S)])
    code, text = _amb("checkout", "r3", str(tmp_path / "out"), "--json", "--store", str(root))
    assert code == 0, text
    report = json.loads(text)
    assert _tree(tmp_path / "out") == {"small.txt": b"s"}
    assert report["not_kept"] == [
        {
            "path": "model.bin",
            "size": 10**9,
            "sha256": "sha256:" + "ab" * 32,
            "kept": False,
            "event": "shim:0",
            "note": "above the content size cap: only its hash was recorded",
        }
    ]
    code, text = _amb("checkout", "r3", str(tmp_path / "out2"), "--store", str(root))
    assert "not kept: model.bin (1000000000 bytes" in text
    code, text = _amb("files", "r3", "--json", "--store", str(root))
    listed = {f["path"]: f for f in json.loads(text)["files"]}
    assert code == 0 and listed["model.bin"] == report["not_kept"][0] and listed["small.txt"]["kept"]
    code, text = _amb("files", "r3", "--at", "shim:0", "--store", str(root))
    assert code == 0 and "model.bin" in text and "small.txt" not in text


def test_hostile_paths_never_write_outside_the_directory(tmp_path):
    root = tmp_path / "store"
    evil = [
        "../escaped.txt",
        "a/../../escaped2.txt",
        "/etc/amb-escaped",
        "./x",
        "a//b",
        "",
        "x" * 300,
    ]
    shim: list[tuple[Any, int]] = [(lambda b, p=p: _write(b, p, b"evil"), T0 + S) for p in evil]
    shim += [
        (lambda b: _write(b, "ok.txt", b"fine"), T0 + 2 * S),
        (lambda b: _write(b, "f", b"a file"), T0 + 2 * S),
        (lambda b: _write(b, "f/under", b"under a file"), T0 + 2 * S),  # impossible on a real disk
        (FileRenamed(src="ok.txt", dst="../renamed-out.txt"), T0 + 3 * S),
        (FileDeleted(path="../../../etc/passwd"), T0 + 3 * S),
    ]
    _run(root, "r4", shim)
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    before = sorted(str(p) for p in tmp_path.rglob("*") if "store" not in p.parts)
    code, text = _amb("checkout", "r4", str(sandbox / "out"), "--json", "--store", str(root))
    assert code == 0, text
    report = json.loads(text)
    assert _tree(sandbox / "out") == {"f": b"a file", "ok.txt": b"fine"}
    refused = {r["path"] for r in report["refused"]}
    assert refused == set(evil) - {"/etc/amb-escaped"} | {
        "f/under",
        "../renamed-out.txt",
        "../../../etc/passwd",
    }
    assert [o["path"] for o in report["outside"]] == ["/etc/amb-escaped"]
    assert not Path("/etc/amb-escaped").exists()
    after = sorted(str(p) for p in tmp_path.rglob("*") if "store" not in p.parts and "out" not in p.parts)
    assert after == before

    # A symlink planted where the checkout goes is refused, as is a non-empty directory.
    (sandbox / "link").symlink_to(tmp_path)
    code, text = _amb("checkout", "r4", str(sandbox / "link"), "--store", str(root))
    assert code == 1 and "is a symbolic link" in text
    code, text = _amb("checkout", "r4", str(sandbox / "out"), "--store", str(root))
    assert code == 1 and "not empty" in text


def test_a_checkout_recreates_the_exact_bytes_of_every_name(tmp_path):
    # Names that are not UTF-8 are recorded as text (schemas.ostext); a checkout (and the viewer's tar)
    # makes each file under the very bytes of its name, a name that looks like an escape included.
    root = tmp_path / "store"
    shim = [
        (lambda b: _write(b, os_text(b"d\xfe/x\xff"), b"one"), T0 + S),
        (lambda b: _write(b, os_text(b"\\xff"), b"a backslash, x, f, f"), T0 + S),
        (lambda b: _write(b, os_text(b"gone\xfa"), b"deleted"), T0 + S),
        (FileRenamed(src=os_text(b"d\xfe/x\xff"), dst=os_text(b"d\xfe/y\xfd")), T0 + 2 * S),
        (FileDeleted(path=os_text(b"gone\xfa")), T0 + 2 * S),
        (lambda b: _write(b, "\\x41", b"no name is spelled so"), T0 + 2 * S),
    ]
    _run(root, "r-bytes", shim)
    code, text = _amb("checkout", "r-bytes", str(tmp_path / "out"), "--json", "--store", str(root))
    assert code == 0, text
    report = json.loads(text)
    out = os.fsencode(tmp_path / "out")
    assert sorted(os.listdir(out)) == [b"\\xff", b"d\xfe"]  # (main: d\xfe and \xff spelled out)
    assert os.listdir(out + b"/d\xfe") == [b"y\xfd"]
    assert Path(os.fsdecode(out + b"/d\xfe/y\xfd")).read_bytes() == b"one"
    assert sorted(w["path"] for w in report["written"]) == ["\\\\xff", "d\\xfe/y\\xfd"]
    assert [(r["path"], r["reason"]) for r in report["refused"]] == [
        ("\\x41", "not the recorded text of a name (see schemas.ostext)")
    ]
    with Store.open(root, read_only=True) as st:
        tar, _ = tar_at(st.con, st.blobs, "r-bytes", "end")
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert sorted(os.fsencode(m.name) for m in t.getmembers()) == [b"\\xff", b"d\xfe/y\xfd"]


def test_a_tampered_blob_fails_the_checkout_naming_the_event(tmp_path):
    root = tmp_path / "store"
    _run(
        root,
        "r5",
        [
            (lambda b: _write(b, "a.txt", b"first"), T0 + S),
            (lambda b: _write(b, "b.txt", b"the original content"), T0 + 2 * S),
        ],
    )
    blobs = BlobStore(root / "blobs")
    address = BlobStore(tmp_path / "scratch").put(b"the original content").blob
    replace_blob(blobs, address, zlib.compress(b"the tampered content"))  # wherever it is stored
    out = tmp_path / "out"
    code, text = _amb("checkout", "r5", str(out), "--store", str(root))
    assert code == 1
    assert text.startswith("amb: error: event shim:1 (b.txt): blob sha256:") and "corrupted" in text
    assert not out.exists() and not list(tmp_path.glob(".out.amb-checkout-*"))
    code, text = _amb("checkout", "r5", str(out), "--at", "shim:0", "--store", str(root))
    assert code == 0 and _tree(out) == {"a.txt": b"first"}


def test_bad_moments_are_one_clear_error(tmp_path):
    root = tmp_path / "store"
    _run(root, "r6", [(lambda b: _write(b, "a.txt", b"a"), T0 + S)])
    for args, message in [
        (["--at", "shim:99"], "event shim:99: the run has no such event"),
        (["--at", "nonsense"], "moment 'nonsense': expected end, start"),
        (["--time", "yesterday"], "time 'yesterday': not an ISO 8601 time"),
        (["--step", "1", "--before-submit"], "give at most one of"),
        # Digits of other scripts: str.isdigit says yes to them, int() to some of them only.
        (["--at", "step:²"], "step '²': a step is a number from 1"),
        (["--at", "step:١"], "step '١': a step is a number from 1"),
        (["--at", "shim:²"], "moment 'shim:²': expected end, start"),
    ]:
        code, text = _amb("checkout", "r6", str(tmp_path / "o"), *args, "--store", str(root))
        assert code == 2 and message in text and "Traceback" not in text, (args, text)
    code, text = _amb("checkout", "nope", str(tmp_path / "o"), "--store", str(root))
    assert code == 3 and f"no run 'nope' in the store at {root}" in text
