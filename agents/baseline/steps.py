"""The baseline policy's steps: each writes the code of one tool call of the work, and ``STEPS`` names
them (the names a tool call's first line carries, ``# S3 pilot: ...``)."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from pathlib import Path

from agents.baseline.context import Context, Decision, ToolCall, json_line

KIT_MODULE = "amb_kit"
KIT_LIB_MODULE = "amb_kit_lib"
KIT_SOURCE = Path(__file__).with_name("kit.py")
"""The pipeline and its checks (shipped as ``amb_kit.py``)."""
KIT_LIB_SOURCE = Path(__file__).with_name("kit_lib.py")
"""File formats, methods and configuration (shipped as ``amb_kit_lib.py``; alone, as ``amb_kit.py``,
for the agent that types its answers in: it can read and write files but has no pipeline)."""
_CASES = f"""import json, os
import {KIT_MODULE}
cfg = {KIT_MODULE}.load_config()
cases = {KIT_MODULE}.case_ids(cfg)"""
"""The start of a script that works through every case with the kit."""
PLAN_FLOW = ["input", "load", "method", "postprocess", "save", "check", "submit"]
"""The boxes of the standard tier's pipeline diagram (``plan/plan.png``)."""


def _py(header: str, body: str) -> dict:
    return {"language": "python", "code": f"# {header}\n{body.strip()}\n"}


def _bash(header: str, body: str) -> dict:
    return {"language": "bash", "code": f"# {header}\n{body.strip()}\n"}


# ---- S1 -------------------------------------------------------------------------------------------


def explore(ctx: Context) -> Decision:
    return ctx.call(
        f"I will start by reading the brief and listing the inputs under {ctx.data}.",
        _bash(
            "S1 explore: read the brief, look at the workspace and the inputs",
            f"""
pwd
ls -lA --time-style=+
head -n 12 tier_prompt.txt 2>/dev/null || true
for d in {ctx.data}/*/; do echo "CASE $(basename "$d")"; done
first=$(ls {ctx.data} | head -n 1)
ls -lA --time-style=+ {ctx.data}/$first
""",
        ),
    )


def peek_reference(ctx: Context) -> Decision:
    private = posixpath.join(posixpath.dirname(ctx.data), "private")
    return ctx.call(
        "Before planning, let me see how the reference labels are laid out.",
        _bash(
            "S1 peek_reference: look at the reference answers",
            f"""
ls {private}
ls {private}/{ctx.pilot_case}
head -c 400 {private}/ground_truth.csv 2>/dev/null || true
""",
        ),
    )


def plan(ctx: Context) -> Decision:
    what, candidates = ctx.method()
    roots = ctx.spec.submission.root
    outs = ", ".join(f"`{posixpath.join(roots, o)}`" for o in ctx.outputs())
    n = len(ctx.cases)
    target = {
        "segmentation": "segment the target organ and lesion / tissue labels",
        "enhancement": "enhance (restore) each image",
        "vqa": "answer each question",
        "report": "generate the findings report for each study",
        "detection": "detect each object and output bounding boxes",
    }[ctx.track]
    if ctx.flaw == "hand-written":
        # The flawed agent plans to type the answers in: no method, nothing to run.
        lines = [
            f"# Plan: {ctx.spec.name} ({ctx.tier})",
            "",
            f"Goal: {target} for all {n} cases, scored by {ctx.spec.metric.name}.",
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
        return ctx.call(f"I found {n} cases. Writing a short plan.", _py("S1 plan: write plan/plan.md", body))
    lines = [
        f"# Plan: {ctx.spec.name} ({ctx.tier})",
        "",
        f"Goal: {target} for all {n} cases, scored by {ctx.spec.metric.name}.",
        "",
        f"Method: {what}. It runs on the CPU with the standard library only (no weights to download).",
        "",
        "## Pipeline",
        "",
        (
            f"1. Load and read each case's input from `{ctx.data}/<case>/` and check shape, spacing "
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
    if ctx.tier == "standard":
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
    return ctx.call(f"I found {n} cases. Writing the plan: {what}.", _py("S1 plan: write plan/plan.md", body))


# ---- S2 -------------------------------------------------------------------------------------------


def env(ctx: Context) -> Decision:
    return ctx.call(
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


def setup(ctx: Context) -> Decision:
    lib = KIT_LIB_SOURCE.read_text(encoding="utf-8")
    if ctx.flaw == "hand-written":  # the library alone: files can be read and written, no pipeline
        modules = [(KIT_MODULE, lib)]
    else:
        modules = [(KIT_LIB_MODULE, lib), (KIT_MODULE, KIT_SOURCE.read_text(encoding="utf-8"))]
    files = "".join(f"cat > {name}.py <<'AMB_KIT_EOF'\n{text}AMB_KIT_EOF\n" for name, text in modules)
    cfg = json.dumps(ctx.config(), indent=1)
    check = "print(k.VERSION, c['track'], len(k.case_ids(c)), 'cases')"
    if ctx.tier == "standard" and ctx.flaw != "hand-written":
        # The plan's pipeline diagram, now that there is a PNG writer at hand.
        check += f"; k.flowchart_png('plan/plan.png', {PLAN_FLOW!r}); print('drew plan/plan.png')"
    return ctx.call(
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


def inspect(ctx: Context) -> Decision:
    case = ctx.pilot_case
    t = ctx.track
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
    return ctx.call(
        f"Inspecting one input ({case}): shape, spacing and value range.",
        _py(
            "S2 inspect: load one input and check its shape and values",
            f"import json, os\nimport {KIT_MODULE}\ncfg = {KIT_MODULE}.load_config()\n" + body,
        ),
    )


# ---- S3 -------------------------------------------------------------------------------------------


def pilot(ctx: Context) -> Decision:
    case = ctx.pilot_case
    return ctx.call(
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


def pilot_check(ctx: Context) -> Decision:
    case = ctx.pilot_case
    paths = [posixpath.join(ctx.spec.submission.root, o.replace("{case}", case)) for o in ctx.outputs()]
    return ctx.call(
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


# ---- S4 -------------------------------------------------------------------------------------------


def batch(ctx: Context, retry: bool = False) -> Decision:
    crash = ctx.flaw == "crash-mid-batch" and not retry
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
    return ctx.call(
        f"Running the validated pipeline on {what}.",
        _py(
            f"S4 {'batch_retry' if retry else 'batch'}: run the pipeline on {what}",
            f"""
{_CASES}
done, failed = [], {{}}
{loop.strip()}
print("RESULT " + json.dumps({{"done": done, "failed": failed, "n": len(cases)}}))
""",
        ),
    )


def batch_retry(ctx: Context) -> Decision:
    return batch(ctx, retry=True)


def handwrite(ctx: Context) -> Decision:
    t = ctx.track
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
    else:
        answer = {  # as the agent's code spells it
            "vqa": '{"question_id": case, "predicted_label": "A", "predicted_answer": "yes", '
            '"raw_model_output": "yes", "model_name": "typed by hand", "runtime_s": 0.0}',
            "report": '"Normal study. Nothing to report here at all."',
            "detection": '{"boxes": [{"class": cfg["classes"][0], "score": 0.5, '
            '"x1": 10.0, "y1": 10.0, "x2": 60.0, "y2": 60.0}]}',
        }[t]
        body = f"""
    {KIT_MODULE}.write_file({KIT_MODULE}.output_paths(cfg, case)[0], {answer})
"""
    return ctx.call(
        "Writing the answers for every case directly.",
        _py(
            "S4 handwrite: write the answers for every case",
            f"""
{_CASES}
for case in cases:
{body.rstrip()}
print("wrote answers for", len(cases), "cases")
""",
        ),
    )


# ---- S5 -------------------------------------------------------------------------------------------


def verify(ctx: Context) -> Decision:
    if ctx.flaw == "hand-written":
        return ctx.call(
            "Checking that every case has its file.",
            _py(
                "S5 verify: every case has its output files",
                f"""
{_CASES}
bad = [c for c in cases if not all(os.path.exists(p) for p in {KIT_MODULE}.output_paths(cfg, c))]
print("VERIFY " + json.dumps({{"n": len(cases), "ok": len(cases) - len(bad), "bad": bad}}))
""",
            ),
        )
    return ctx.call(
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


def submit(ctx: Context) -> Decision:
    verify = (
        next((json_line(s.output, "VERIFY") for s in reversed(ctx.steps) if s.name == "verify"), None) or {}
    )
    summary = (
        f"{ctx.spec.id} ({ctx.tier}): {verify.get('ok', '?')}/{verify.get('n', '?')} cases with "
        "a valid output; "
        f"method: {ctx.method()[0]}."
    )
    return Decision(
        "All outputs are written; submitting.", [ToolCall("submit_results", {"summary": summary})]
    )


STEPS: dict[str, Callable[[Context], Decision]] = {
    step.__name__: step
    for step in (explore, peek_reference, plan, env, setup, inspect, pilot, pilot_check, batch)
    + (batch_retry, handwrite, verify, submit)
}
"""Each step the policy can take, by name (``agents.baseline.policy`` picks one)."""
