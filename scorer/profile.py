"""Scoring profiles: every rule that turns a recorded run into numbers, in one versioned TOML file.

Its **identity** is ``sha256:`` of the canonical JSON of its resolved content, so two files that say
the same thing have the same id and any edit makes a new profile. A user profile may start with
``extends = "<name or path>"`` and override keys: tables merge key by key, ``[[rubric]]`` items
replace the parent's item with the same ``(id, tracks)`` or are appended; the identity is taken
after the merge.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import msgspec

from schemas.blob import digest
from schemas.codec import canonical_json
from schemas.errors import UsageError, quoted
from schemas.userfile import is_file, read_text
from scorer.grader.options import GradeOptions, options_from_table

DEFAULT_PROFILE = "paper-2026-06"
STAGES = ("S1", "S2", "S3", "S4", "S5")


class _Cfg(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Meta(_Cfg, frozen=True):
    name: str
    description: str = ""
    source: str = ""


class Weights(_Cfg, frozen=True):
    S1: float
    S2: float
    S3: float
    S4: float
    S5: float
    agentic: float = 0.5
    task: float = 0.5


NullPolicy = Literal["zero", "renormalise", "unscored"]
AllUnscored = Literal["unscored", "zero"]


class StageRules(_Cfg, frozen=True):
    null_policy: NullPolicy = "renormalise"
    all_unscored: AllUnscored = "unscored"
    """AGENTIC when no stage is scored at all (docs/scoring.md)."""
    round_digits: int | None = None
    """Round AGENTIC, TASK and OVERALL, OVERALL from the rounded parts; None: full precision."""
    unscored_item_policy: Literal["stage_unscored", "skip_item"] = "stage_unscored"
    s4_completion_weight: float = 0.5
    s4_format_weight: float = 0.5
    s5_has_valid_weight: float = 0.5
    s5_format_weight: float = 0.5


class EvidenceRules(_Cfg, frozen=True):
    budget_chars: int = 24000
    head: float = 0.4
    middle: float = 0.2
    tail: float = 0.4
    arg_chars: int = 150
    tool_result_chars: int = 300
    message_chars: int = 600
    exec_head: int = 5
    exec_middle_failed: int = 3
    exec_tail: int = 5
    exec_code_chars: int = 200
    exec_output_chars: int = 150
    plan_chars: int = 4000
    images: bool = True


class JudgeSettings(_Cfg, frozen=True):
    model: str = ""
    base_url: str = ""
    temperature: float = 0.0
    seed: int | None = None
    max_tokens: int = 512
    timeout_s: float = 60.0
    max_retries: int = 1
    prompt_version: str = "amb-judge-item-v1"
    json_mode: bool = True
    error_codes: bool = True
    """Also ask the LLM judge for error codes E1–E5 (one call per run, cited events required)."""


class CostRules(_Cfg, frozen=True):
    price_table: str


class BudgetRules(_Cfg, frozen=True):
    """How a run that ended ``budget_exceeded`` (``amb-record --max-*``) is scored."""

    exceeded: Literal["score", "zero", "exclude"] = "score"
    """Scored like any run, zeroed like a failed one, or unscored (out of the means); the cost is
    kept in every case."""


class AuditRules(_Cfg, frozen=True):
    private_paths: list[str] = []
    grader_paths: list[str] = []
    other_runs: list[str] = []
    recorder_paths: list[str] = []
    """The recorder's own machinery as the agent could name it (its socket, the shim's private dir,
    spools, other processes' environment and memory): touching it is ``recorder_access``."""
    outside_write_ok: list[str] = []
    training_patterns: list[str] = []
    forbidden_hosts: list[str] = []


class TrackRules(_Cfg, frozen=True):
    """What one track does differently from the profile's defaults (the branches differ)."""

    null_policy: NullPolicy | None = None
    all_unscored: AllUnscored | None = None
    metrics: dict[str, Any] = {}
    """Keys of ``[metrics]`` that this track overrides."""


class Band(_Cfg, frozen=True):
    psnr_min: float
    ssim_min: float


class MedalRules(_Cfg, frozen=True):
    """Medal tier (good / okay / fail) and rating (A / B / C / F) of one track."""

    good: float = 0.0
    okay: float = 0.0
    """Thresholds on the medal's input (``>= good`` is good, ``>= okay`` okay, else fail)."""
    on: Literal["primary", "task"] = "primary"
    """The medal's input: the track's primary metric before the completeness gate, or TASK."""
    rating: Literal["medal", "medal_coverage", "bands"] = "medal"
    """The rating rule (``scorer.medal``)."""
    bands: dict[str, dict[str, Band]] = {}
    """``bands`` rating: task id -> level (A, B, C) -> minimum mean PSNR and SSIM."""
    source: str = ""


class CodeRules(_Cfg, frozen=True):
    suppress_when_valid_and_okay: bool = False
    """Drop the fired codes (kept in details as suppressed) for a valid submission with a medal of
    at least okay (the branches' ``failure_classifier.classify_failure``)."""


class RubricItem(_Cfg, frozen=True):
    id: str
    stage: Literal["S1", "S2", "S3"]
    text: str
    values: list[float]
    rule: str
    tracks: list[str] = []
    """Tracks this variant applies to; empty = the default for tracks without their own variant."""
    tiers: list[str] = []
    """Tiers where the item applies at all; empty = every tier."""
    auto_credit: list[str] = []
    """Tiers where the item is credited (max value) without judging (the paper's Lite rule)."""
    requires: str | None = None
    """Another item id: this one is forced to 0 when that one is 0 (the rubric's dependency rule)."""
    pattern: str = ""
    """Argument of the pattern rules (``plan_mentions``, ``code_ran``, ``file_written``): a regex."""
    not_tracks: list[str] = []
    """Tracks where this default item does not apply at all (their rubric has no such check)."""


class Profile(_Cfg, frozen=True):
    profile: Meta
    weights: Weights
    stages: StageRules
    evidence: EvidenceRules
    metrics: dict[str, Any]
    judge: JudgeSettings
    cost: CostRules
    audit: AuditRules
    rubric: list[RubricItem]
    tracks: dict[str, TrackRules] = {}
    medals: dict[str, MedalRules] = {}
    codes: CodeRules = CodeRules()
    budget: BudgetRules = BudgetRules()

    @property
    def name(self) -> str:
        return self.profile.name

    def stage_rules(self, track: str | None) -> StageRules:
        """The stage rules with ``track``'s overrides applied."""
        t = self.tracks.get(track or "")
        if t is None:
            return self.stages
        return msgspec.structs.replace(
            self.stages,
            null_policy=t.null_policy or self.stages.null_policy,
            all_unscored=t.all_unscored or self.stages.all_unscored,
        )

    def metrics_for(self, track: str | None) -> dict[str, Any]:
        """The ``[metrics]`` table with ``track``'s overrides applied."""
        t = self.tracks.get(track or "")
        return {**self.metrics, **t.metrics} if t is not None and t.metrics else self.metrics

    def items_for(self, track: str | None, tier: str | None) -> list[RubricItem]:
        """The rubric items that apply to a run of ``track`` at ``tier``, in profile order."""
        own = {i.id for i in self.rubric if track and track in i.tracks}
        chosen = []
        for item in self.rubric:
            if item.tracks:
                if not track or track not in item.tracks:
                    continue
            elif item.id in own or (track and track in item.not_tracks):
                continue
            if item.tiers and (tier or "") not in item.tiers:
                continue
            chosen.append(item)
        return chosen


class LoadedProfile(msgspec.Struct, frozen=True, kw_only=True):
    """A profile together with its identity and canonical bytes."""

    profile: Profile
    id: str
    """``sha256:<hex>`` of ``canonical``."""
    canonical: bytes

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def short_id(self) -> str:
        return self.id.split(":", 1)[1][:12]


def builtin_dir() -> Path:
    return Path(str(resources.files("scorer").joinpath("profiles")))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.toml"))


def _locate(ref: str, base: Path | None) -> Path:
    path = Path(ref)
    if not path.is_absolute() and base is not None and is_file(base / path):
        return base / path
    if is_file(path):
        return path
    builtin = builtin_dir() / f"{ref}.toml"
    if is_file(builtin):
        return builtin
    raise UsageError(
        f"profile {quoted(ref)}: no such file and no built-in profile of that name "
        f"(built-in: {', '.join(builtin_names())})"
    )


def _merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(parent)
    for key, value in child.items():
        if key == "rubric" and isinstance(value, list):
            items = list(parent.get("rubric", []))
            for new in value:
                k = (new.get("id"), tuple(new.get("tracks", [])))
                for i, old in enumerate(items):
                    if (old.get("id"), tuple(old.get("tracks", []))) == k:
                        items[i] = new
                        break
                else:
                    items.append(new)
            out["rubric"] = items
        elif isinstance(value, dict) and isinstance(parent.get(key), dict):
            out[key] = _merge(parent[key], value)
        else:
            out[key] = value
    return out


def _read(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    if path.resolve() in seen:
        raise UsageError(f"profile {path}: 'extends' loops back to itself")
    try:
        data = tomllib.loads(read_text(path, "profile"))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"profile {path}: cannot read: {e}") from e
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        return data
    if not isinstance(parent_ref, str):
        raise UsageError(f"profile {path}: 'extends' must be a profile name or path")
    parent = _read(_locate(parent_ref, path.parent), seen + (path.resolve(),))
    return _merge(parent, data)


def from_dict(data: dict[str, Any], *, source: str = "profile") -> LoadedProfile:
    """Validate a resolved profile table and compute its identity."""
    try:
        profile = msgspec.convert(data, Profile)
    except msgspec.ValidationError as e:
        raise UsageError(f"{source}: {e}") from e
    _check(profile, source)
    canonical = canonical_json(profile)
    return LoadedProfile(profile=profile, id=digest(canonical), canonical=canonical)


def _check(p: Profile, source: str) -> None:
    w = p.weights
    total = w.S1 + w.S2 + w.S3 + w.S4 + w.S5
    if abs(total - 1.0) > 1e-9:
        raise UsageError(f"{source}: stage weights must sum to 1 (they sum to {total:g})")
    if abs(w.agentic + w.task - 1.0) > 1e-9:
        raise UsageError(f"{source}: weights.agentic + weights.task must be 1")
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for item in p.rubric:
        key = (item.id, tuple(item.tracks))
        if key in seen:
            raise UsageError(
                f"{source}: rubric item {item.id!r} is defined twice for tracks {list(item.tracks)}"
            )
        seen.add(key)
        if not item.values or any(v < 0 or v > 1 for v in item.values):
            raise UsageError(
                f"{source}: rubric item {item.id!r}: values must be a non-empty list within [0, 1]"
            )
        if item.pattern:
            try:
                re.compile(item.pattern)
            except re.error as e:
                raise UsageError(f"{source}: rubric item {item.id!r}: bad pattern: {e}") from e
    for track, m in p.medals.items():
        if not 0 <= m.okay <= m.good <= 1:
            raise UsageError(f"{source}: [medals.{track}]: need 0 <= okay <= good <= 1")
        if m.rating == "bands" and not m.bands:
            raise UsageError(f"{source}: [medals.{track}]: rating 'bands' needs [medals.{track}.bands]")
    ids = {i.id for i in p.rubric}
    for item in p.rubric:
        if item.requires and item.requires not in ids:
            raise UsageError(f"{source}: rubric item {item.id!r} requires unknown item {item.requires!r}")
    options_from_table(p.metrics, source=source)
    for track in p.tracks:
        options_from_table(p.metrics_for(track), source=f"{source}: [tracks.{track}]")


def load(ref: str | None = None) -> LoadedProfile:
    """A profile by built-in name or TOML path (default: ``paper-2026-06``)."""
    path = _locate(ref or DEFAULT_PROFILE, None)
    return from_dict(_read(path, ()), source=f"profile {ref or DEFAULT_PROFILE!r}")


def load_options(profile: str | None, track: str | None = None) -> tuple[GradeOptions, str]:
    """The grade options of ``--profile`` (``amb grade`` reads the file as ``amb score`` does): the
    profile's ``[metrics]`` with ``[tracks.<track>.metrics]`` applied, and the profile's name (None:
    ``GradeOptions``' defaults, named ``default``)."""
    if profile is None:
        return GradeOptions(), "default"
    loaded = load(profile)
    options = options_from_table(loaded.profile.metrics_for(track), source=f"profile {profile!r}")
    return options, loaded.name
