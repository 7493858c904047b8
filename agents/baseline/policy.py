"""The baseline's "model": a deterministic scripted policy that does honest work, one track at a time.

Given a chat request (the whole conversation so far), ``decide`` returns the next assistant turn.
Nothing is remembered between requests: the policy reads the conversation, as a model would. The
system prompt tells it the task (the brief's title), the tier and where the data is; each earlier
tool call names its step in its first line (``# S3 pilot: ...``) and each tool result says how it
went (exit code, printed ``CASE``/``RESULT``/``CHECK`` lines). From those it picks the next step:

    explore → plan → env → setup → inspect → pilot → pilot_check → batch [→ batch_retry] → verify → submit

A failed step is retried once; a batch that left cases without output is re-run on the missing
cases once. ``flaw`` injects one of the failures AutoMedBench's error taxonomy is made of:

- ``no-pilot``: skips the one-case pilot and its check (S3, error code E3);
- ``wrong-filename``: writes every output under a wrong file name (S4/S5 and TASK, E5);
- ``crash-mid-batch``: the batch dies half-way with a traceback and is not re-run (S4, E4/E5);
- ``hand-written``: types answers into files instead of running a method (S2/S3 and TASK);
- ``private-path``: peeks at the private reference folder (a rule violation: S1–S5 zeroed).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.task_spec import TaskSpec

FLAWS = ("no-pilot", "wrong-filename", "crash-mid-batch", "hand-written", "private-path")
KIT_MODULE = "amb_kit"
KIT_LIB_MODULE = "amb_kit_lib"
KIT_SOURCE = Path(__file__).with_name("kit.py")
"""The pipeline and its checks (shipped as ``amb_kit.py``)."""
KIT_LIB_SOURCE = Path(__file__).with_name("kit_lib.py")
"""File formats, methods and configuration (shipped as ``amb_kit_lib.py``; alone, as ``amb_kit.py``,
for the agent that types its answers in: it can read and write files but has no pipeline)."""
PLAN_FLOW = ["input", "load", "method", "postprocess", "save", "check", "submit"]
"""The boxes of the standard tier's pipeline diagram (``plan/plan.png``)."""
STEP_RE = re.compile(r"^#\s*(S\d)\s+([a-z_]+)\b")
DATA_RE = re.compile(r"^Task data \(read-only\):\s*(\S+)\s*$", re.M)
TIER_RE = re.compile(r"^Tier:\s*(lite|standard)\s*$", re.M)
CASE_LINE = re.compile(r"^CASE (\S+)\s*$", re.M)


class PolicyError(ValueError):
    """The conversation gives the policy nothing to act on (no brief it recognises)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Decision:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class _Step:
    name: str
    exit_code: int | None
    output: str


# ---- reading the conversation ---------------------------------------------------------------------


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def identify_task(system: str, data: str) -> tuple[TaskSpec, str | None]:
    """The task (and tier) whose brief the system prompt carries.

    Briefs name the container's data folder; an agent run elsewhere points them at its own, so that
    is undone before comparing. The whole brief is looked for first, then its title line alone.
    """
    from tasks.registry import all_specs, brief

    text = system.replace(data.rstrip("/"), "/data/public") if data else system
    by_title = []
    for spec in all_specs():
        for tier in ("lite", "standard"):
            try:
                body = brief(spec.id, tier).strip()
            except Exception:
                continue
            if body and body in text:
                return spec, tier
            title = body.splitlines()[0] if body else ""
            if title and re.search(rf"^{re.escape(title)}\s*$", text, re.M):
                by_title.append((spec, tier))
    if by_title:
        return by_title[0]
    raise PolicyError("the system prompt carries no task brief this baseline knows")


def _history(messages: list[dict]) -> list[_Step]:
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"}
    steps = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") or {}
            name = fn.get("name", "")
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = {}
            if name == "submit_results":
                step = "submit"
            else:
                match = STEP_RE.match(str(args.get("code", "")).lstrip())
                step = match.group(2) if match else "other"
            raw = results.get(tc.get("id"))
            code, out = None, raw or ""
            if raw is not None:
                try:
                    parsed = json.loads(raw)
                    code = parsed.get("exit_code")
                    out = (parsed.get("stdout") or "") + "\n" + (parsed.get("stderr") or "")
                except (ValueError, AttributeError):
                    code = 0 if "ACCEPTED" in raw else None
            steps.append(_Step(step, code, out))
    return steps


# ---- the plan of work -----------------------------------------------------------------------------


def _sequence(flaw: str | None) -> list[str]:
    if flaw == "hand-written":
        return ["explore", "plan", "env", "setup", "inspect", "handwrite", "verify", "submit"]
    seq = ["explore", "plan", "env", "setup", "inspect", "pilot", "pilot_check", "batch", "verify", "submit"]
    if flaw == "no-pilot":
        seq = [s for s in seq if s not in ("pilot", "pilot_check")]
    if flaw == "private-path":
        seq.insert(1, "peek_reference")
    return seq


def decide(messages: list[dict], flaw: str | None = None) -> Decision:
    if flaw is not None and flaw not in FLAWS:
        raise PolicyError(f"unknown flaw {flaw!r} (known: {', '.join(FLAWS)})")
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    if not system:
        system = _text(messages[0].get("content")) if messages else ""
    data_m = DATA_RE.search(system)
    data = (data_m.group(1) if data_m else "/data/public").rstrip("/")
    spec, brief_tier = identify_task(system, data)
    tier_m = TIER_RE.search(system)
    tier = tier_m.group(1) if tier_m else (brief_tier or "lite")
    steps = _history(messages)
    ctx = _Ctx(spec, data, tier, flaw, steps)
    if steps and steps[-1].name == "submit":
        return Decision("The results are submitted; the task is complete.")
    nxt = _next_step(ctx)
    return getattr(ctx, "step_" + nxt)()


def _next_step(ctx: _Ctx) -> str:
    steps, seq = ctx.steps, _sequence(ctx.flaw)
    if not steps:
        return seq[0]
    last = steps[-1]
    names = [s.name for s in steps]

    def after(name: str) -> str:
        return seq[seq.index(name) + 1] if name in seq and seq.index(name) + 1 < len(seq) else "submit"

    if last.name == "batch":
        result = _json_line(last.output, "RESULT")
        if ctx.flaw != "crash-mid-batch" and (last.exit_code != 0 or (result and result.get("failed"))):
            return "batch_retry"  # re-run the cases that have no output yet
        return after("batch")
    if last.name == "batch_retry":
        return after("batch")
    if (
        last.exit_code not in (0, None)
        and last.name in seq
        and names.count(last.name) == 1
        and last.name != "peek_reference"
    ):
        return last.name  # one more try of a step that failed
    return after(last.name)


def _json_line(output: str, tag: str) -> dict | None:
    for line in reversed(output.splitlines()):
        if line.startswith(tag + " "):
            try:
                return json.loads(line[len(tag) + 1 :])
            except ValueError:
                return None
    return None


# ---- the steps ------------------------------------------------------------------------------------


def _py(header: str, body: str) -> dict:
    return {"language": "python", "code": f"# {header}\n{body.strip()}\n"}


def _bash(header: str, body: str) -> dict:
    return {"language": "bash", "code": f"# {header}\n{body.strip()}\n"}


class _Ctx:
    def __init__(self, spec: TaskSpec, data: str, tier: str, flaw: str | None, steps: list[_Step]):
        self.spec, self.data, self.tier, self.flaw, self.steps = spec, data, tier, flaw, steps
        self.track = spec.track

    # facts from earlier results
    @property
    def cases(self) -> list[str]:
        for s in self.steps:
            if s.name == "explore":
                return CASE_LINE.findall(s.output)
        return []

    @property
    def pilot_case(self) -> str:
        cases = self.cases
        return cases[0] if cases else "UNKNOWN"

    def _call(self, content: str, args: dict) -> Decision:
        return Decision(content, [ToolCall("execute_code", args)])

    # what the method is, in words (for the plan) and as configuration (for the kit)
    def method(self) -> tuple[str, list[str]]:
        t = self.track
        if t == "segmentation":
            assert self.spec.seg is not None
            what = (
                "intensity thresholding of enhancing soft tissue, connected components (largest "
                "regions kept), "
                "region growing, and darker sub-regions inside the organ as the lesion"
                if self.spec.seg.mode == "binary"
                else "Otsu foreground thresholding and intensity quantile bins mapped to the tissue labels"
            )
            return what, [
                "classical thresholding + connected components (chosen: no weights to download)",
                "nnU-Net family checkpoint (needs weights and a GPU)",
                "MONAI bundle / VISTA3D (needs weights and a GPU)",
            ]
        if t == "enhancement":
            assert self.spec.enh is not None
            what = (
                "a 3x3 binomial smoothing filter"
                if self.spec.enh.kind == "denoise"
                else f"bilinear upsampling by x{self.spec.enh.scale}"
            )
            return what, [
                f"classical filter: {what} (chosen)",
                "DRUNet / deep denoiser (needs weights)",
                "Swin2SR transformer (needs weights)",
            ]
        if t == "vqa":
            return (
                "an answer prior per question type (the most frequent answer: 'no' for yes/no questions, "
                "a normal or first option for multiple choice)"
            ), [
                "answer prior per question type (chosen: no model available offline)",
                "LLaVA-Med v1.5 (needs weights)",
                "general VLM (needs weights)",
            ]
        if t == "report":
            return "a normal-study findings template filled from the manifest", [
                "findings template from the manifest (chosen)",
                "CheXagent (needs weights)",
                "BLIP captioning (needs weights)",
            ]
        return "a blob detector (background threshold, connected components, one box per blob)", [
            "blob detector on the thresholded image (chosen)",
            "YOLOv8 fine-tuned (needs weights)",
            "Faster R-CNN (needs weights)",
        ]

    def outputs(self) -> list[str]:
        files = list(self.spec.submission.files)
        if self.flaw == "wrong-filename":
            files = [posixpath.join(posixpath.dirname(f), "pred_" + posixpath.basename(f)) for f in files]
        return files

    def config(self) -> dict:
        s = self.spec
        cfg: dict[str, Any] = {
            "task": s.id,
            "track": s.track,
            "data": self.data,
            "root": s.submission.root,
            "outputs": self.outputs(),
        }
        if s.track == "segmentation":
            assert s.seg is not None
            cfg.update(mode=s.seg.mode, input_file=s.seg.input_file or s.public.files[0])
            if s.seg.mode == "binary":
                # CT has a fixed scale (Hounsfield units): enhancing soft tissue; other modalities are
                # thresholded relative to the image itself.
                cfg.update(window=[85.0, 300.0] if "CT" in s.modality.split() else None)
                cfg.update(
                    kinds=[t.kind for t in s.seg.targets],
                    label_ids=[1],
                    keep=2 if re.search(r"\bkidneys\b|two kidney", self.brief_hint(), re.I) else 1,
                )
            else:
                cfg.update(label_ids=[lab.id for lab in s.seg.labels])
        elif s.track == "enhancement":
            assert s.enh is not None
            cfg.update(kind=s.enh.kind, scale=s.enh.scale, input_file=s.enh.input_file, passes=1)
        elif s.track == "vqa":
            assert s.vqa is not None
            cfg.update(question_file=s.vqa.question_file)
        elif s.track == "report":
            assert s.report is not None
            cfg.update(
                manifest_file=s.report.manifest_file,
                style=s.report.style,
                section=s.report.section,
                min_chars=s.report.min_chars,
            )
        else:
            assert s.det is not None
            cfg.update(input_file=s.det.image_file, classes=list(s.submission.classes) or [s.det.wildcard])
        return cfg

    def brief_hint(self) -> str:
        from tasks.registry import brief

        try:
            return brief(self.spec.id, self.tier)
        except Exception:
            return ""

    # S1
    def step_explore(self) -> Decision:
        return self._call(
            f"I will start by reading the brief and listing the inputs under {self.data}.",
            _bash(
                "S1 explore: read the brief, look at the workspace and the inputs",
                f"""
pwd
ls -lA --time-style=+
head -n 12 tier_prompt.txt 2>/dev/null || true
for d in {self.data}/*/; do echo "CASE $(basename "$d")"; done
first=$(ls {self.data} | head -n 1)
ls -lA --time-style=+ {self.data}/$first
""",
            ),
        )

    def step_peek_reference(self) -> Decision:
        private = posixpath.join(posixpath.dirname(self.data), "private")
        return self._call(
            "Before planning, let me see how the reference labels are laid out.",
            _bash(
                "S1 peek_reference: look at the reference answers",
                f"""
ls {private}
ls {private}/{self.pilot_case}
head -c 400 {private}/ground_truth.csv 2>/dev/null || true
""",
            ),
        )

    def step_plan(self) -> Decision:
        what, candidates = self.method()
        roots = self.spec.submission.root
        outs = ", ".join(f"`{posixpath.join(roots, o)}`" for o in self.outputs())
        n = len(self.cases)
        target = {
            "segmentation": "segment the target organ and lesion / tissue labels",
            "enhancement": "enhance (restore) each image",
            "vqa": "answer each question",
            "report": "generate the findings report for each study",
            "detection": "detect each object and output bounding boxes",
        }[self.track]
        if self.flaw == "hand-written":
            # The flawed agent plans to type the answers in: no method, nothing to run.
            lines = [
                f"# Plan: {self.spec.name} ({self.tier})",
                "",
                f"Goal: {target} for all {n} cases, scored by {self.spec.metric.name}.",
                "",
                "Approach: write the answers directly; the cases look alike, so one answer fits all.",
                "",
                "1. List the cases.",
                f"2. Write an answer file for each case to {outs}.",
                "3. Check that every case has its file.",
                "4. Submit.",
            ]
            body = (
                "import os\nos.makedirs('plan', exist_ok=True)\nwith open('plan/plan.md', 'w') as f:\n    "
                f"f.write({chr(10).join(lines)!r} + '\\n')\nprint('wrote plan/plan.md')\n"
            )
            return self._call(
                f"I found {n} cases. Writing a short plan.", _py("S1 plan: write plan/plan.md", body)
            )
        lines = [
            f"# Plan: {self.spec.name} ({self.tier})",
            "",
            f"Goal: {target} for all {n} cases, scored by {self.spec.metric.name}.",
            "",
            f"Method: {what}. It runs on the CPU with the standard library only (no weights to download).",
            "",
            "## Pipeline",
            "",
            (
                f"1. Load and read each case's input from `{self.data}/<case>/` and check shape, spacing "
                "and value range."
            ),
            "2. Preprocess: nothing beyond type conversion.",
            f"3. Run inference with the method ({what}) -> predict the output.",
            f"4. Postprocess and write the output to {outs} in the required format.",
            "5. Pilot on one case first: check the output's shape, values and file name before the batch.",
            (
                "6. Run the batch on every case, then verify that every case has a well-formed output, "
                "then submit."
            ),
            "",
            "Flow: input -> load -> method -> postprocess -> save -> check -> submit.",
        ]
        if self.tier == "standard":
            lines += ["", "## Candidates compared", "", "| candidate | needs | decision |", "|---|---|---|"]
            lines += [
                f"| {c.split(' (')[0]} | {'weights + GPU' if 'needs' in c else 'CPU only'} | "
                f"{'chosen' if 'chosen' in c else 'not available offline'} |"
                for c in candidates
            ]
            lines += ["", "The pipeline diagram is in plan/plan.png."]
        plan = "\n".join(lines) + "\n"
        body = f"""
import os
os.makedirs("plan", exist_ok=True)
plan = {plan!r}
with open("plan/plan.md", "w") as f:
    f.write(plan)
print("wrote plan/plan.md,", len(plan), "chars")
"""
        return self._call(
            f"I found {n} cases. Writing the plan: {what}.", _py("S1 plan: write plan/plan.md", body)
        )

    # S2
    def step_env(self) -> Decision:
        return self._call(
            "Checking the environment: Python version, disk space, available libraries.",
            _py(
                "S2 env: check the environment",
                """
import importlib.util, platform, shutil, sys
print("python", sys.version.split()[0], platform.platform())
free = shutil.disk_usage(".").free
print("free disk:", "at least 1 GB" if free >= 1e9 else "under 1 GB")
for mod in ("numpy", "nibabel", "PIL", "torch"):
    print(mod, "available" if importlib.util.find_spec(mod) else "missing")
print("plan: the classical method needs only the standard library")
""",
            ),
        )

    def step_setup(self) -> Decision:
        lib = KIT_LIB_SOURCE.read_text(encoding="utf-8")
        if self.flaw == "hand-written":  # the library alone: files can be read and written, no pipeline
            modules = [(KIT_MODULE, lib)]
        else:
            modules = [(KIT_LIB_MODULE, lib), (KIT_MODULE, KIT_SOURCE.read_text(encoding="utf-8"))]
        files = "".join(f"cat > {name}.py <<'AMB_KIT_EOF'\n{text}AMB_KIT_EOF\n" for name, text in modules)
        cfg = json.dumps(self.config(), indent=1)
        check = "print(k.VERSION, c['track'], len(k.case_ids(c)), 'cases')"
        if self.tier == "standard" and self.flaw != "hand-written":
            # The plan's pipeline diagram, now that there is a PNG writer at hand.
            check += f"; k.flowchart_png('plan/plan.png', {PLAN_FLOW!r}); print('drew plan/plan.png')"
        return self._call(
            f"Setting up: writing the helper module {KIT_MODULE}.py and the pipeline configuration.",
            _bash(
                "S2 setup: write the helper module and the pipeline configuration",
                f"""
{files}cat > pipeline.json <<'AMB_CFG_EOF'
{cfg}
AMB_CFG_EOF
python3 -c "import {KIT_MODULE} as k; c = k.load_config(); {check}"
""",
            ),
        )

    def step_inspect(self) -> Decision:
        case = self.pilot_case
        t = self.track
        if t == "segmentation":
            body = f"""
vol = {KIT_MODULE}.read_nifti(os.path.join(cfg["data"], "{case}", cfg["input_file"]))
print("shape", vol.shape, "spacing", vol.spacing, "dtype", vol.dtype,
      "min", min(vol.values), "max", max(vol.values))
"""
        elif t == "enhancement":
            body = f"""
shape, values = {KIT_MODULE}.read_npy(os.path.join(cfg["data"], "{case}", cfg["input_file"]))
print("shape", shape, "min", min(values), "max", max(values), "finite", all(v == v for v in values))
"""
        elif t == "detection":
            body = f"""
width, height, gray = {KIT_MODULE}.read_png_gray(os.path.join(cfg["data"], "{case}", cfg["input_file"]))
print("size", width, "x", height, "shape", (height, width), "min", min(gray), "max", max(gray))
"""
        else:
            name = "question_file" if t == "vqa" else "manifest_file"
            body = f"""
with open(os.path.join(cfg["data"], "{case}", cfg["{name}"])) as f:
    record = json.load(f)
print(json.dumps(record, indent=1)[:800])
print("files:", sorted(os.listdir(os.path.join(cfg["data"], "{case}"))), "size", len(record))
"""
        return self._call(
            f"Inspecting one input ({case}): shape, spacing and value range.",
            _py(
                "S2 inspect: load one input and check its shape and values",
                f"import json, os\nimport {KIT_MODULE}\ncfg = {KIT_MODULE}.load_config()\n" + body,
            ),
        )

    # S3
    def step_pilot(self) -> Decision:
        case = self.pilot_case
        return self._call(
            f"Pilot: running the pipeline on one case ({case}) only.",
            _py(
                f"S3 pilot: run the pipeline on one case ({case})",
                f"""
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
written = {KIT_MODULE}.run_case(cfg, "{case}")
print("pilot wrote", written)
""",
            ),
        )

    def step_pilot_check(self) -> Decision:
        case = self.pilot_case
        paths = [posixpath.join(self.spec.submission.root, o.replace("{case}", case)) for o in self.outputs()]
        return self._call(
            "Checking the pilot's output before running the batch.",
            _py(
                "S3 pilot_check: inspect the pilot output (shape, values, file names)",
                f"""
import json, os
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
for path in {paths!r}:
    print(path, "exists" if os.path.exists(path) else "MISSING",
          os.path.getsize(path) if os.path.exists(path) else 0, "bytes")
report = {KIT_MODULE}.check_case(cfg, "{case}")
assert len(report["problems"]) == 0, report["problems"]
print("CHECK " + json.dumps(report))
""",
            ),
        )

    # S4
    def step_batch(self, retry: bool = False) -> Decision:
        crash = self.flaw == "crash-mid-batch" and not retry
        skip = (
            "\n    if all(os.path.exists(p) for p in "
            + KIT_MODULE
            + ".output_paths(cfg, case)):\n        continue"
            if retry
            else ""
        )
        if crash:
            loop = f"""
for i, case in enumerate(cases):
    if i == len(cases) // 2:
        # injected flaw (baseline --flaw crash-mid-batch): the batch dies half-way
        raise MemoryError("worker ran out of memory on case %s" % case)
    {KIT_MODULE}.run_case(cfg, case)
    done.append(case)
    print("done", case, flush=True)
"""
        else:
            loop = f"""
for i, case in enumerate(cases):{skip}
    try:
        {KIT_MODULE}.run_case(cfg, case)
        done.append(case)
        print("done", case, "(%d/%d)" % (i + 1, len(cases)), flush=True)
    except Exception as e:
        failed[case] = "%s: %s" % (type(e).__name__, e)
        print("FAILED", case, failed[case], flush=True)
"""
        what = "the cases still missing an output" if retry else "every case"
        return self._call(
            f"Running the validated pipeline on {what}.",
            _py(
                f"S4 {'batch_retry' if retry else 'batch'}: run the pipeline on {what}",
                f"""
import json, os
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
cases = {KIT_MODULE}.case_ids(cfg)
done, failed = [], {{}}
{loop.strip()}
print("RESULT " + json.dumps({{"done": done, "failed": failed, "n": len(cases)}}))
""",
            ),
        )

    def step_batch_retry(self) -> Decision:
        return self.step_batch(retry=True)

    def step_handwrite(self) -> Decision:
        t = self.track
        # Answers typed in by hand: no method looks at the cases' content.
        if t == "segmentation":
            body = f"""
    vol = {KIT_MODULE}.read_nifti(os.path.join(cfg["data"], case, cfg["input_file"]))
    nx, ny, nz = vol.shape[0], vol.shape[1], vol.shape[2]
    cube = bytearray(nx * ny * nz)
    for z in range(nz // 3, 2 * nz // 3):
        for y in range(ny // 3, 2 * ny // 3):
            for x in range(nx // 3, 2 * nx // 3):
                cube[x + nx * (y + ny * z)] = cfg["label_ids"][0]
    for path in {KIT_MODULE}.output_paths(cfg, case):
        {KIT_MODULE}.write_nifti(path, vol, cube)
"""
        elif t == "enhancement":
            body = f"""
    shape, values = {KIT_MODULE}.read_npy(os.path.join(cfg["data"], case, cfg["input_file"]))
    shape = tuple(s * cfg["scale"] for s in shape)
    {KIT_MODULE}.write_npy({KIT_MODULE}.output_paths(cfg, case)[0], shape, [0.0] * (shape[0] * shape[1]))
"""
        elif t == "vqa":
            body = f"""
    path = {KIT_MODULE}.output_paths(cfg, case)[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({{"question_id": case, "predicted_label": "A", "predicted_answer": "yes",
                   "raw_model_output": "yes", "model_name": "typed by hand", "runtime_s": 0.0}}, f)
"""
        elif t == "report":
            body = f"""
    path = {KIT_MODULE}.output_paths(cfg, case)[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("Normal study. Nothing to report here at all.")
"""
        else:
            body = f"""
    path = {KIT_MODULE}.output_paths(cfg, case)[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        box = {{"class": cfg["classes"][0], "score": 0.5, "x1": 10.0, "y1": 10.0, "x2": 60.0, "y2": 60.0}}
        json.dump({{"boxes": [box]}}, f)
"""
        return self._call(
            "Writing the answers for every case directly.",
            _py(
                "S4 handwrite: write the answers for every case",
                f"""
import json, os
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
cases = {KIT_MODULE}.case_ids(cfg)
for case in cases:
{body.rstrip()}
print("wrote answers for", len(cases), "cases")
""",
            ),
        )

    # S5
    def step_verify(self) -> Decision:
        if self.flaw == "hand-written":
            return self._call(
                "Checking that every case has its file.",
                _py(
                    "S5 verify: every case has its output files",
                    f"""
import json, os
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
cases = {KIT_MODULE}.case_ids(cfg)
bad = [c for c in cases if not all(os.path.exists(p) for p in {KIT_MODULE}.output_paths(cfg, c))]
print("VERIFY " + json.dumps({{"n": len(cases), "ok": len(cases) - len(bad), "bad": bad}}))
""",
                ),
            )
        return self._call(
            "Verifying every case's output before submitting.",
            _py(
                "S5 verify: every case has its output files with the right shape and values",
                f"""
import json
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
reports = [{KIT_MODULE}.check_case(cfg, case) for case in {KIT_MODULE}.case_ids(cfg)]
bad = [r for r in reports if not r["ok"]]
for r in bad[:10]:
    print("PROBLEM", r["case"], r["problems"])
summary = {{"n": len(reports), "ok": len(reports) - len(bad), "bad": [r["case"] for r in bad]}}
print("VERIFY " + json.dumps(summary))
""",
            ),
        )

    def step_submit(self) -> Decision:
        verify = (
            next((_json_line(s.output, "VERIFY") for s in reversed(self.steps) if s.name == "verify"), None)
            or {}
        )
        summary = (
            f"{self.spec.id} ({self.tier}): {verify.get('ok', '?')}/{verify.get('n', '?')} cases with "
            "a valid output; "
            f"method: {self.method()[0]}."
        )
        return Decision(
            "All outputs are written; submitting.", [ToolCall("submit_results", {"summary": summary})]
        )

    def step_other(self) -> Decision:
        return self.step_submit()
