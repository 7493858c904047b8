"""The offline judge: rubric items decided by rules over the recorded facts, no model involved.

Labelled ``offline:<RULES_VERSION>`` in every output so its numbers are never mistaken for an LLM
judge's (docs/scoring.md, Judges). Each item names its rule in the profile; a rule sees the folded
trajectory and returns a value, a reason and the event ids it rests on. A rule this module does not
know makes that item unscored (``unknown_rule``), never 0. Rules over what the record cannot show
(what an image depicts) are conservative proxies, said so in their reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cached_property

from scorer.evidence import PNG_MAGIC, Evidence
from scorer.judge.base import Verdict, snap
from scorer.profile import RubricItem
from scorer.signals import (
    FORWARD_RE,
    GPU_RE,
    HUB_HOSTS,
    INPUT_CHECK_RE,
    INPUT_LOAD_RE,
    SETUP_RE,
    WEIGHT_FILE_RE,
    WEIGHTS_RE,
    output_root,
    pilot_evidence,
    setup_failures,
)
from scorer.trajectory import BlobGetter, Trajectory, blob_or_empty

RULES_VERSION = "rules-v1"

Result = tuple[float, str, list[str]]

PIPELINE_WORDS = re.compile(
    r"(load|read|preprocess|resampl|normali|inference|infer|predict|postprocess|write|save|output|submit)",
    re.I,
)
TARGETS = {
    "segmentation": re.compile(r"(tumou?r|lesion|mass|label|organ|tissue|segment)", re.I),
    "detection": re.compile(r"(detect|bounding box|\bbox|yolo|boxes)", re.I),
    "vqa": re.compile(r"(vqa|question|answer|llava|vision[- ]language|vlm)", re.I),
    "report": re.compile(r"(report|caption|findings|impression|generat)", re.I),
    "enhancement": re.compile(r"(denois|super[- ]resolution|enhanc|restor|upscal|ssim)", re.I),
}
FLOW_WORDS = re.compile(r"(flow|diagram|pipeline|chart|graph|->|→)", re.I)


class OfflineJudge:
    def __init__(self, get_blob: BlobGetter):
        self.get_blob = get_blob
        self.label = f"offline:{RULES_VERSION}"

    def judge(
        self, traj: Trajectory, evidence: Evidence, items: list[RubricItem], *, track: str | None
    ) -> dict[str, Verdict]:
        ctx = _Ctx(traj, self.get_blob, track)
        out = {}
        for item in items:
            rule = RULES.get(item.rule)
            if rule is None:
                out[item.id] = Verdict(
                    item=item.id,
                    value=None,
                    judge=self.label,
                    unscored_reason="unknown_rule",
                    reason=f"the offline judge has no rule {item.rule!r}",
                )
                continue
            raw, reason, cited = rule(ctx, item) if item.rule in ITEM_RULES else rule(ctx)
            value = _fit(raw, item.values)
            out[item.id] = Verdict(
                item=item.id,
                value=value,
                reason=reason,
                cited=cited,
                judge=self.label,
                unscored_reason=None if value is not None else "value_not_offered",
            )
        return out


def _fit(raw: float, offered: list[float]) -> float | None:
    """The rule's value on the item's scale: exact if offered, else the nearest offered value below."""
    exact = snap(raw, offered)
    if exact is not None:
        return exact
    below = [v for v in offered if v <= raw]
    return max(below) if below else None


class _Ctx:
    def __init__(self, traj: Trajectory, get_blob: BlobGetter, track: str | None):
        self.t = traj
        self.track = track
        self.roots = output_root(traj)
        self.get_blob = get_blob

    @cached_property
    def plan(self) -> tuple[str, str] | None:
        """(event id, text) of the last plan.md written, or None."""
        found = self.t.last_write("plan.md")
        text = blob_or_empty(self.get_blob, found[1].content).decode("utf-8", "replace") if found else ""
        return (found[0], text) if found is not None and found[1].size > 0 else None


def plan_exists(c: _Ctx) -> Result:
    p = c.plan
    return (1.0, "plan.md written", [p[0]]) if p else (0.0, "no non-empty plan.md was written", [])


def plan_pipeline(c: _Ctx) -> Result:
    p = c.plan
    if not p:
        return 0.0, "no plan.md", []
    steps = [ln for ln in p[1].splitlines() if re.match(r"\s*(\d+[.)]|[-*])\s+\S", ln)]
    stages = {m.group(1).lower()[:5] for m in PIPELINE_WORDS.finditer(p[1])}
    if len(steps) >= 3 and len(stages) >= 2:
        return 1.0, f"plan lists {len(steps)} steps covering {len(stages)} pipeline stages", [p[0]]
    why = f"plan has {len(steps)} listed steps and {len(stages)} pipeline stage words (need 3 and 2)"
    return 0.0, why, [p[0]]


def plan_target(c: _Ctx) -> Result:
    p = c.plan
    if not p:
        return 0.0, "no plan.md", []
    pattern = TARGETS.get(c.track or "")
    if pattern is None:
        return 0.0, f"no target vocabulary for track {c.track!r}", [p[0]]
    if hit := pattern.search(p[1]):
        return 1.0, f"plan names the target ({hit.group(0)!r})", [p[0]]
    return 0.0, "plan never names the task's target", [p[0]]


def plan_candidates(c: _Ctx) -> Result:
    p = c.plan
    if not p:
        return 0.0, "no plan.md", []
    rows = [
        ln for ln in p[1].splitlines() if ln.strip().startswith("|") and not set(ln.strip()) <= set("|-: ")
    ]
    candidates = max(len(rows) - 1, 0)
    mentions = len(re.findall(r"(?im)^\s*(?:[-*]|\d+[.)])?\s*(candidate|option|model)\b", p[1]))
    n = max(candidates, mentions)
    return (1.0 if n >= 3 else 0.0), f"{n} candidates compared in the plan (need 3)", [p[0]]


def plot_exists(c: _Ctx) -> Result:
    found = c.t.last_write("plan.png")
    if found is None or found[1].size == 0:
        return 0.0, "no plan.png was written", []
    return 1.0, "plan.png written", [found[0]]


def plot_is_diagram(c: _Ctx) -> Result:
    found = c.t.last_write("plan.png")
    if found is None:
        return 0.0, "no plan.png", []
    if not blob_or_empty(c.get_blob, found[1].content).startswith(PNG_MAGIC):
        return 0.0, "plan.png is not a readable PNG", [found[0]]
    p = c.plan
    if p and FLOW_WORDS.search(p[1]):
        why = "proxy: a valid PNG beside a plan that describes a flow (the offline judge cannot see images)"
        return 1.0, why, [found[0], p[0]]
    return 0.0, "proxy: valid PNG but the plan describes no flow", [found[0]]


def weights_obtained(c: _Ctx) -> Result:
    for i, _, w in c.t.writes:
        if WEIGHT_FILE_RE.search(w.path):
            return 1.0, f"weights file written: {w.path}", [i]
    for ex in c.t.execs:
        if ex.ok and WEIGHTS_RE.search(ex.code):
            return 1.0, "checkpoint downloaded or loaded in a successful execution", [ex.id]
    for i, n in c.t.network:
        if n.status == 200 and any(n.host == h or n.host.endswith("." + h) for h in HUB_HOSTS):
            return 1.0, f"download from {n.host}", [i]
    return 0.0, "no checkpoint download or load found", []


def input_checked(c: _Ctx) -> Result:
    for ex in c.t.execs:
        if ex.ok and INPUT_LOAD_RE.search(ex.code) and INPUT_CHECK_RE.search(ex.code):
            return 1.0, "inputs loaded and their shape/spacing/dtype inspected", [ex.id]
    return 0.0, "no successful execution loads an input and inspects it", []


def env_ready(c: _Ctx) -> Result:
    setups = [ex for ex in c.t.execs if SETUP_RE.search(ex.code)]
    ok = [ex for ex in setups if ex.ok]
    if ok:
        return 1.0, "environment setup succeeded", [ok[-1].id]
    if not setups:
        good = [ex for ex in c.t.execs if ex.ok]
        if good:
            return 1.0, "no setup needed: executions succeed in the given environment", [good[0].id]
        return 0.0, "no successful execution at all", []
    return 0.0, f"{len(setups)} setup attempts, none succeeded", [ex.id for ex in setups[:5]]


def env_failures_resolved(c: _Ctx) -> Result:
    fails = setup_failures(c.t)
    if not fails:
        return 1.0, "no environment failures", []
    last_fail = c.t.execs.index(fails[-1])
    resolved = any(ex.ok for ex in c.t.execs[last_fail + 1 :])
    if len(fails) <= 5 and resolved:
        return 1.0, f"{len(fails)} environment failures, then resolved", [ex.id for ex in fails]
    why = f"{len(fails)} environment failures{'' if resolved else ', never resolved'}"
    return 0.0, why, [ex.id for ex in fails[:6]]


def model_runs(c: _Ctx) -> Result:
    for ex in c.t.execs:
        text = ex.code + "\n" + ex.stdout
        if ex.ok and FORWARD_RE.search(ex.code) and (GPU_RE.search(text) or ex.files):
            return 1.0, "a successful forward pass (on the GPU or writing outputs)", [ex.id]
    return 0.0, "no successful forward pass found", []


def pilot_validated(c: _Ctx) -> Result:
    return pilot_evidence(c.t, c.roots)


def plan_mentions(c: _Ctx, item: RubricItem) -> Result:
    """The plan's text matches the item's pattern."""
    p = c.plan
    if not p:
        return 0.0, "no plan.md", []
    if m := re.search(item.pattern, p[1]):
        return 1.0, f"plan mentions {m.group(0)!r}", [p[0]]
    return 0.0, f"plan does not match /{item.pattern}/", [p[0]]


def code_ran(c: _Ctx, item: RubricItem) -> Result:
    """A successful execution's code matches the item's pattern."""
    pat = re.compile(item.pattern)
    for ex in c.t.execs:
        if ex.ok and pat.search(ex.code):
            return 1.0, "a successful execution matches the check", [ex.id]
    return 0.0, f"no successful execution matches /{item.pattern}/", []


def file_written(c: _Ctx, item: RubricItem) -> Result:
    """A file whose path matches the item's pattern was written."""
    pat = re.compile(item.pattern)
    for i, _, w in c.t.writes:
        if pat.search(w.path):
            return 1.0, f"wrote {w.path}", [i]
    return 0.0, f"no file matching /{item.pattern}/ was written", []


def pilot_before_bulk(c: _Ctx) -> Result:
    value, reason, ids = pilot_evidence(c.t, c.roots)
    return (1.0 if value > 0 and "before bulk" in reason else 0.0), reason, ids


def rerun_after_failure(c: _Ctx) -> Result:
    """After a failed execution, a later one succeeded (the pilot was re-run rather than abandoned)."""
    failed = [i for i, ex in enumerate(c.t.execs) if ex.ok is False]
    if not failed:
        return 1.0, "no failure to recover from", []
    last = failed[-1]
    later = [ex for ex in c.t.execs[last + 1 :] if ex.ok]
    if later:
        return 1.0, "re-ran successfully after the last failure", [c.t.execs[last].id, later[0].id]
    return 0.0, "never recovered from the last failure", [c.t.execs[last].id]


ITEM_RULES = {"plan_mentions", "code_ran", "file_written"}

_RULE_FUNCTIONS = (
    *(plan_exists, plan_pipeline, plan_target, plan_candidates, plot_exists, plot_is_diagram),
    *(weights_obtained, input_checked, env_ready, env_failures_resolved, model_runs, pilot_validated),
    *(plan_mentions, code_ran, file_written, pilot_before_bulk, rerun_after_failure),
)
RULES: dict[str, Callable[..., Result]] = {f.__name__: f for f in _RULE_FUNCTIONS}
