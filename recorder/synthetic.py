"""Synthetic runs through the real write path (spool writers and the blob store).

A generated run looks like an AutoMedBench agent run: a shared system prompt and a task brief,
~35 model calls whose requests carry the whole growing conversation (so blob dedup matters),
``execute_code`` tool calls and their results, the processes and file writes the shim would see,
a sealed submission, and ``run.finished``. Deterministic for a seed (content and timestamps), so
tests and benchmarks can rely on it. It is data for tests, demos and benchmarks, not a scorer
fixture: nothing here knows what a score should be.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import NamedTuple

from recorder.spool import SpoolWriter, spool_path
from schemas.blob import BlobRef, digest
from schemas.blobstore import BlobStore
from schemas.events import (
    AssistantMessage,
    FileDeleted,
    FileWritten,
    ModelCallCompleted,
    NetworkRequest,
    Payload,
    ProcessExited,
    RunFinished,
    RunStarted,
    SealedFile,
    SubmissionSealed,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.ostext import os_text
from schemas.providers import CHAT, build_response
from schemas.providers.conversation import Conversation, Message, Part, Reply, Tool
from schemas.providers.openai_chat import build_request
from schemas.run_claim import claiming, require_free

TASKS = ("kidney-seg", "ldct-denoising", "vqa-rad", "mimic-cxr-report", "bccd-det")
MODELS = ("gpt-5.1", "claude-opus-4.5", "gemini-3-pro", "qwen3-coder-480b")

SYSTEM_PROMPT = (
    "You are an autonomous medical-imaging research agent working inside a sandbox. "
    "Use the execute_code tool to run Python or bash. Plan first and save the plan to plan/plan.md, "
    "set up the environment, validate on one case, run inference on every case, then call "
    "submit_results. Never read private data or modify the grader.\n"
) * 12

PLAN = b"# Plan\n1. Inspect data\n2. Set up model\n3. Pilot on one case\n4. Full inference\n5. Submit\n"

STEPS = (
    ("bash", "ls -la /data/public && cat brief.md | head -50"),
    ("bash", f"mkdir -p plan && cat > plan/plan.md <<'EOF'\n{PLAN.decode()}EOF"),
    ("bash", "nvidia-smi || true; python3 -c 'import torch; print(torch.__version__)'"),
    ("bash", "pip install --quiet monai nibabel"),
    (
        "python",
        "import nibabel as nib\nimg = nib.load('/data/public/case_00000/ct.nii.gz')\n"
        "print(img.shape, img.header.get_zooms())",
    ),
    (
        "python",
        "from pipeline import run_case\nrun_case('case_00000', out='agents_outputs/case_00000')\n"
        "print('pilot done')",
    ),
    (
        "python",
        "import numpy as np, nibabel as nib\n"
        "m = nib.load('agents_outputs/case_00000/organ.nii.gz').get_fdata()\n"
        "print('voxels', int(m.sum()), 'labels', np.unique(m))",
    ),
    (
        "python",
        "from pipeline import run_case\nimport glob\nfor c in sorted(glob.glob('/data/public/*')):\n"
        "    run_case(c.split('/')[-1], out='agents_outputs/' + c.split('/')[-1])",
    ),
)


REPLIES = [
    "",
    "Let me check the data first.",
    "The pilot looks right; running all cases.",
    "Fixing the import error.",
]
"""What the model says beside its tool call (one drawn per call)."""
FAILED_OUTPUT = (
    'Traceback (most recent call last):\n  File "<stdin>", line 1\n'
    "ModuleNotFoundError: No module named 'monai'\n"
)
TOOLS = [Tool("execute_code"), Tool("submit_results")]


FIRST_START_NS = 1_780_000_000_000_000_000
"""When the run of seed 0 starts (2026-05-28); run ``seed`` starts two hours per seed later."""
SEED_STEP_NS = 7_200_000_000_000
MAX_SEED = 1_000_000
"""The largest seed: its run starts in 2254, years before the last time a 64-bit nanosecond clock
holds (2262), so every event's time fits however many calls the run makes."""


MAX_CALLS = 10_000
"""The most model calls a generated run makes: every request carries the whole conversation so far,
so a run's bodies grow with the square of its calls."""


class Generated(NamedTuple):
    run_id: str
    events: int
    blobs: int


def _clock(rng: random.Random, start_ns: int):
    now = start_ns

    def tick(ms_low: float = 5, ms_high: float = 400) -> int:
        nonlocal now
        now += int(rng.uniform(ms_low, ms_high) * 1e6)
        return now

    return tick


def generate_run(
    store: str | os.PathLike[str],
    run_id: str,
    *,
    seed: int = 0,
    calls: int = 35,
    processes_per_call: int = 1,
    sync: bool = False,
) -> Generated:
    """Write one synthetic run's spools and blobs into ``store`` (not yet ingested).

    A run id the store holds is refused (``RunExists``), checked and written under the store's claim
    lock (``schemas.run_claim.claiming``): runs are never merged."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed {seed} is outside 0..{MAX_SEED}")
    with claiming(store):
        require_free(store, run_id, "pick another run id (amb generate: --seed or --prefix)")
        run = _Run(store, run_id, seed, processes_per_call, sync)
        started = run.tick()
        run.emit("recorder", run.run_started(), ts=started)
        run.cases = [f"case_{i:05d}" for i in range(run.rng.randint(3, 8))]
        for turn in range(calls):
            last = turn == calls - 1
            tool_call_id, language, code = run.model_call(turn, last)
            if last:
                break
            run.execution(turn, tool_call_id, language, code)
        run.finish(started)
        return Generated(run_id, run.events, run.blob_count)


class _Run:
    """One synthetic run being written: its spools and blobs, its clock, and the conversation so
    far. Every random draw comes from one generator in a fixed order, so a seed gives the same run
    (content and timestamps) every time."""

    def __init__(
        self, store: str | os.PathLike[str], run_id: str, seed: int, processes_per_call: int, sync: bool
    ):
        root = Path(store)
        self.run_id, self.seed, self.processes_per_call, self.sync = run_id, seed, processes_per_call, sync
        self.rng = random.Random(seed)
        self.blobs = BlobStore(root / "blobs")
        self.task = TASKS[seed % len(TASKS)]
        self.model = MODELS[seed % len(MODELS)]
        self.tier = "lite" if seed % 2 == 0 else "standard"
        self.tick = _clock(self.rng, FIRST_START_NS + seed * SEED_STEP_NS)
        self.writers = {
            s: SpoolWriter(spool_path(root, run_id, s), run_id, s, sync=sync)
            for s in ("recorder", "proxy", "shim")
        }
        self.events = self.blob_count = 0
        brief = f"# Task {self.task} ({self.tier})\n" + (
            "Segment the organ and lesion for every case; write agents_outputs/<case>/... " * 20
        )
        self.history = [Message("system", Part.texts(SYSTEM_PROMPT)), Message("user", Part.texts(brief))]
        self.pending_results: list[tuple[str, str]] = []
        self.request_ref: BlobRef | None = None
        self.response_ref: BlobRef | None = None
        self.cases: list[str] = []
        self.written: dict[str, tuple[int, str]] = {}
        self.pid = 100

    def put(self, data: bytes, media_type: str, base: BlobRef | None = None) -> BlobRef:
        self.blob_count += 1
        return self.blobs.put(data, media_type, sync=self.sync, base=base)

    def emit(self, source: str, payload: Payload, ts: int | None = None) -> None:
        self.writers[source].append(payload, ts_ns=self.tick() if ts is None else ts)
        self.events += 1

    def run_started(self) -> RunStarted:
        return RunStarted(
            task=self.task,
            tier=self.tier,
            agent="synthetic-agent",
            model=self.model,
            command=["amb-agent", "--model", self.model],
            backend="synthetic",
            workspace="/workspace",
            time_limit_s=3600.0,
            labels={"repeat": str(self.seed % 3), "generator": "synthetic"},
            tool_versions={"amb": "0.1.0"},
        )

    def model_call(self, turn: int, last: bool) -> tuple[str, str, str]:
        """The results of the last turn's tool call, then one model call asking for the next (the
        last one submits); returns the tool call's id, language and code."""
        call_id = f"{self.run_id}-c{turn:03d}"
        for tool_call_id, output in self.pending_results:
            self.emit(
                "proxy",
                ToolCallResult(
                    tool_call_id=tool_call_id,
                    model_call_id=call_id,
                    name="execute_code",
                    output=output,
                    is_error="Traceback" in output,
                ),
            )
        self.pending_results = []
        request = json.dumps(build_request(Conversation(self.history, TOOLS, self.model))).encode()
        language, code = STEPS[turn % len(STEPS)]
        code = code + f"\n# step {turn}"
        tool_call_id = f"call_{self.seed}_{turn}"
        name = "submit_results" if last else "execute_code"
        arguments = json.dumps({} if last else {"language": language, "code": code})
        text = self.rng.choice(REPLIES)
        message = AssistantMessage(
            text=text, tool_calls=[ToolCallPart(id=tool_call_id, name=name, arguments=arguments)]
        )
        reply = Reply(message=message, model=self.model, stop_reason="tool_calls", id=call_id)
        response = build_response(CHAT, reply)
        # Each request extends the one before, and responses look alike: stored as deltas against
        # the previous of each, as the proxy stores them.
        self.request_ref = self.put(request, "application/json", base=self.request_ref)
        input_tokens = len(request) // 4
        cached = input_tokens - self.rng.randint(200, 900) if turn else 0
        output_tokens = self.rng.randint(40, 600)
        t0 = self.tick(1, 5)
        self.response_ref = self.put(response, "application/json", base=self.response_ref)
        self.emit(
            "proxy",
            ModelCallCompleted(
                call_id=call_id,
                provider="openai",
                api="chat.completions",
                model=self.model,
                stream=turn % 2 == 0,
                url="https://api.openai.com/v1/chat/completions",
                status=200,
                ok=True,
                request=self.request_ref,
                response=self.response_ref,
                message=message,
                stop_reason="tool_calls",
                usage=Usage(
                    input_total=input_tokens,
                    cache_read=max(cached, 0),
                    output=output_tokens,
                    reasoning=output_tokens // 3,
                ),
                started_ns=t0,
                ttfb_ms=self.rng.uniform(200, 1500),
                latency_ms=self.rng.uniform(1500, 20000),
            ),
        )
        self.emit("proxy", ToolCallRequested(tool_call_id, name, arguments, model_call_id=call_id))
        self.history.append(Message("assistant", reply.parts()))
        return tool_call_id, language, code

    def execution(self, turn: int, tool_call_id: str, language: str, code: str) -> None:
        """What the shim sees of one tool call: the interpreter and the helpers it spawns, the
        files it writes, a download; its output becomes the next request's tool result."""
        failed = self.rng.random() < 0.12
        output = FAILED_OUTPUT if failed else f"ok step {turn}\n" + "x" * self.rng.randint(10, 1500)
        self._processes(language, code, failed)
        if "plan/plan.md" in code:
            self._file("plan/plan.md", PLAN, "text/markdown", op="created")  # (rewritten whole)
        if "pip install" in code:
            self.emit(
                "shim",
                NetworkRequest(
                    method="GET",
                    scheme="https",
                    host="pypi.org",
                    port=443,
                    path="/simple/monai/",
                    status=200,
                    response_bytes=self.rng.randint(2000, 90000),
                    duration_ms=self.rng.uniform(20, 300),
                ),
            )
        if "run_case" in code:
            for case in self.cases[: 1 if "pilot" in code else None]:
                for part in ("organ", "lesion"):
                    content = self.rng.randbytes(self.rng.randint(300, 3000))
                    self._file(f"agents_outputs/{case}/{part}.nii.gz", content, "application/gzip")
            if self.rng.random() < 0.3:
                self.emit("shim", FileDeleted(path="agents_outputs/tmp.log"))
        self.history.append(Message("tool", [Part.result(output, tool_call_id)]))
        self.pending_results.append((tool_call_id, output))

    def _processes(self, language: str, code: str, failed: bool) -> None:
        parent = self.pid
        for k in range(self.processes_per_call):
            self.pid += 1
            start = self.tick(1, 20)
            if k:
                argv = ["python3", "-c", f"import sys; sys.exit({int(failed and k == 1)})"]
            else:
                argv = ["python3", "-c", code] if language == "python" else ["bash", "-lc", code]
            self.emit(
                "shim",
                ProcessExited(
                    pid=self.pid,
                    ppid=parent if k else 1,
                    argv=[os_text(a) for a in argv],
                    cwd="/workspace",
                    start_ns=start,
                    end_ns=self.tick(5, 3000),
                    exit_code=1 if failed and k == 0 else 0,
                    tracer="synthetic",
                ),
            )

    def _file(self, path: str, content: bytes, media_type: str, op: str | None = None) -> None:
        op = op or ("modified" if path in self.written else "created")
        sha = digest(content)
        self.emit(
            "shim",
            FileWritten(
                path=path, op=op, size=len(content), sha256=sha, content=self.put(content, media_type)
            ),
        )
        self.written[path] = (len(content), sha)

    def finish(self, started: int) -> None:
        files = [SealedFile(path=p, size=s, sha256=d) for p, (s, d) in sorted(self.written.items())]
        self.emit("recorder", SubmissionSealed(root="/workspace", files=files))
        finished = self.tick()
        self.emit(
            "recorder",
            RunFinished(
                status="completed",
                exit_code=0,
                duration_s=(finished - started) / 1e9,
                counts={s: w.next_seq for s, w in self.writers.items()},
            ),
            ts=finished,
        )
        for w in self.writers.values():
            w.close()
