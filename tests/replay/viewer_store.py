"""The store the viewer tests look at, built once per session.

- real recorded runs: the demo's offline baseline agent on one task twin, clean and with the
  ``crash-mid-batch`` flaw, through ``amb-record`` (so the diff of the two has a first divergence);
- synthetic runs from ``amb generate`` (enough to page and filter the runs list);
- one synthetic run of about 100,000 events (``--processes-per-call``), for deep links;
- a hostile run written through the real spool path: HTML and script in model text, tool
  arguments and file names, a 3 MB file, an image, a request with an inline image, and a read of
  a private path, which the auditor reports (a finding whose link must land on its event);
- scores for the recorded and hostile runs (``amb score``), the audit scanner's findings
  (``amb scan audit``), and a scanner that echoes the hostile run's model text as its finding.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from agents.baseline.server import BaselineServer
from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from schemas.blob import BlobRef, digest
from schemas.blobstore import BlobStore
from schemas.events import (
    AssistantMessage,
    FileAccessed,
    FileWritten,
    ModelCallCompleted,
    RunFinished,
    RunStarted,
    SubmissionSealed,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from tasks.registry import load_spec
from tasks.synth import synth
from tests.fakes.baseline_run import record_baseline_run

BIN = Path(sys.executable).parent
TASK = "bccd-det"
XSS = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'
HOSTILE_PATH = 'out/"><svg onload=window.__pwned=1>.txt'
BIG_RUN_CALLS = 100
BIG_RUN_PROCS = 1010


class ViewerStore(NamedTuple):
    root: Path
    clean: str
    flawed: str
    big: str
    hostile: str
    hostile_private_key: str
    synthetic: list[str]
    twin: Path
    workspace: Path


PATH_FIELDS = ("root", "twin", "workspace")


def save(store: ViewerStore, path: Path) -> None:
    """``store`` as JSON at ``path``, for the other test processes of the session (``load``)."""
    fields = {k: str(v) if k in PATH_FIELDS else v for k, v in store._asdict().items()}
    path.write_text(json.dumps(fields), encoding="utf-8")


def load(path: Path) -> ViewerStore:
    fields: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for k in PATH_FIELDS:
        fields[k] = Path(fields[k])
    return ViewerStore(**fields)


def png(width: int = 8, height: int = 8) -> bytes:
    """A small valid PNG (grey)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\0" + bytes([128]) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def record_baseline(
    root: Path, server: BaselineServer, twin: Path, ws: Path, run_id: str, model: str
) -> None:
    """One lite run of the baseline, its spools left for the store's one ingest."""
    proc = record_baseline_run(
        root,
        server.url,
        twin,
        ws,
        task=TASK,
        tier="lite",
        run_id=run_id,
        model=model,
        record_args=("--label", f"agent={model}", "--no-ingest"),
        agent_args=("--retry-delay", "0.2"),
    )
    # The flawed agent exits 2; so does amb-record when it cannot record at all: the run id it prints
    # on stdout once the run is on disk tells the two apart.
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1:] == [run_id], proc.stderr[-3000:]


def write_hostile_run(root: Path, run_id: str) -> str:
    """A run whose every string is an attack on the page; returns the key of its private read."""
    blobs = BlobStore(root / "blobs")
    writers = {
        s: SpoolWriter(spool_path(root, run_id, s), run_id, s, sync=False)
        for s in ("recorder", "proxy", "shim")
    }
    t = [1_790_000_000_000_000_000]

    def tick() -> int:
        t[0] += 250_000_000
        return t[0]

    writers["recorder"].append(
        RunStarted(
            task=TASK,
            tier="lite",
            agent=XSS,
            model="evil-model",
            backend="synthetic",
            workspace="/workspace",
            labels={"agent": "hostile", XSS: XSS},
        ),
        ts_ns=tick(),
    )
    image = "data:image/png;base64," + base64.b64encode(png()).decode()
    request = json.dumps(
        {
            "model": "evil-model",
            "messages": [
                {"role": "system", "content": XSS},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look " + XSS},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                },
            ],
        }
    ).encode()
    args = json.dumps({"language": "bash", "code": f"cat {XSS}"})
    response = json.dumps({"choices": [{"message": {"content": XSS}}], "html": XSS}).encode()

    def evil_call(call_id: str, request: BlobRef, message: AssistantMessage, **more: Any) -> None:
        """One of the hostile run's model calls (its response the XSS page, served as HTML)."""
        writers["proxy"].append(
            ModelCallCompleted(
                call_id=call_id,
                provider="openai",
                api="chat.completions",
                model="evil-model",
                url="https://api.openai.com/v1/chat/completions",
                status=200,
                request=request,
                response=blobs.put(response, "text/html", sync=False),
                message=message,
                stop_reason="tool_calls",
                started_ns=tick(),
                latency_ms=400.0,
                **more,
            ),
            ts_ns=tick(),
        )

    evil_call(
        "evil-1",
        blobs.put(request, "application/json", sync=False),
        AssistantMessage(
            text=XSS, tool_calls=[ToolCallPart(id="call_x", name="execute_code", arguments=args)]
        ),
        usage=Usage(input_total=100, output=20),
        ttfb_ms=100.0,
    )
    writers["proxy"].append(
        ToolCallRequested(tool_call_id="call_x", name="execute_code", arguments=args, model_call_id="evil-1"),
        ts_ns=tick(),
    )
    writers["proxy"].append(
        ToolCallResult(tool_call_id="call_x", model_call_id="evil-2", name="execute_code", output=XSS),
        ts_ns=tick(),
    )
    # A second call whose request body and tool arguments are JSON nested 100,000 deep (past any
    # decoder's recursion): shown as text that is not JSON, scored without a crash.
    deep = "[" * 100_000 + "]" * 100_000
    evil_call(
        "evil-2",
        blobs.put(('{"model": "evil-model", "messages": ' + deep + "}").encode(), sync=False),
        AssistantMessage(tool_calls=[ToolCallPart(id="call_deep", name="execute_code", arguments=deep)]),
    )
    writers["proxy"].append(
        ToolCallRequested(
            tool_call_id="call_deep", name="execute_code", arguments=deep, model_call_id="evil-2"
        ),
        ts_ns=tick(),
    )
    big = (XSS + "\n") * (3_000_000 // (len(XSS) + 1))
    for path, content in (
        (HOSTILE_PATH, big.encode()),
        ("plots/figure.png", png(64, 48)),
        ("notes.html", XSS.encode()),
    ):
        writers["shim"].append(
            FileWritten(
                path=path,
                op="created",
                size=len(content),
                sha256=digest(content),
                content=blobs.put(content, "application/octet-stream", sync=False),
            ),
            ts_ns=tick(),
        )
    private = writers["shim"].append(
        FileAccessed(path="/data/private/labels/case_00000.json", mode="r"), ts_ns=tick()
    )
    writers["recorder"].append(SubmissionSealed(root="/workspace", files=[]), ts_ns=tick())
    writers["recorder"].append(RunFinished(status="completed", exit_code=0, duration_s=3.0), ts_ns=tick())
    for w in writers.values():
        w.close()
    return f"shim:{private.seq}"


def amb(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(BIN / "amb"), *args, "--store", str(root)], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def build(base: Path) -> ViewerStore:
    root = base / "store"
    twin = base / "twin" / TASK
    synth(load_spec(TASK), twin, cases=2, seed=11)
    ws = base / "ws"
    # amb-record holds a run id machine-wide while it records: the runs of a test process that builds
    # this store (a pytest-xdist worker) have ids of its own, apart from another session's.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "solo")
    clean, flawed = f"baseline-clean-{worker}", f"baseline-flawed-{worker}"
    runs = [("clean", clean, "baseline"), ("flawed", flawed, "baseline+crash-mid-batch")]
    # Both at once: a run is mostly its processes starting, and each writes only its own spools.
    with BaselineServer() as server, ThreadPoolExecutor(len(runs)) as pool:
        list(pool.map(lambda r: record_baseline(root, server, twin, ws / r[0], r[1], r[2]), runs))
    synthetic = [generate_run(root, f"synth-{i:03d}", seed=i, calls=3).run_id for i in range(24)]
    generate_run(root, "big-run", seed=7, calls=BIG_RUN_CALLS, processes_per_call=BIG_RUN_PROCS)
    private_key = write_hostile_run(root, "hostile-run")
    amb(root, "ingest")
    amb(root, "score", clean, flawed, "hostile-run", "--references", str(twin.parent))
    amb(root, "scan", "audit", clean, flawed, "hostile-run")
    echo = base / "echo.py"
    echo.write_text(ECHO_SCANNER)
    amb(root, "scan", str(echo), "hostile-run")
    return ViewerStore(root, clean, flawed, "big-run", "hostile-run", private_key, synthetic, twin, ws)


ECHO_SCANNER = """
from amb.scan import Finding, scanner


@scanner
def echo_model(traj):
    # A scanner that repeats what the agent wrote: the page must show it as text.
    said = [m for m in traj.messages if m.role == "assistant" and m.text]
    if said:
        return Finding(value=said[0].text, explanation=said[0].text, events=[said[0].id])
"""


def chromium_flags() -> list[str]:
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]


CHROMIUM = os.environ.get("AMB_CHROMIUM", "/usr/bin/chromium")
