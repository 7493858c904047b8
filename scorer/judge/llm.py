"""The LLM judge: one rubric item per call through any OpenAI-compatible endpoint (the ``openai`` client).

Temperature 0, a fixed seed where the endpoint supports it, JSON mode when the profile says so.
The reply is parsed fail-closed (``scorer.judge.parse``); every exchange is recorded in full and
cached by the hash of its input, model and settings (``scorer.judge.cache``), so rescoring under an
unchanged profile makes no request at all and reproduces the verdicts byte for byte.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from schemas.codec import canonical_json
from schemas.errors import UsageError
from scorer.evidence import Evidence
from scorer.judge.base import Verdict
from scorer.judge.cache import CallRecord, JudgeCache, call_key
from scorer.judge.parse import parse_codes, parse_verdict
from scorer.judge.prompt import EVIDENCE_PLACEHOLDER, codes_messages
from scorer.judge.prompt import messages as build_messages
from scorer.profile import JudgeSettings, RubricItem
from scorer.trajectory import Trajectory


def endpoint(settings: JudgeSettings) -> tuple[str, str, str] | None:
    """(base_url, api_key, model) from the environment, else the profile; None when incomplete."""
    base_url = os.environ.get("AMB_JUDGE_BASE_URL") or settings.base_url
    model = os.environ.get("AMB_JUDGE_MODEL") or settings.model
    api_key = os.environ.get("AMB_JUDGE_API_KEY") or "not-needed"
    if not base_url or not model:
        return None
    return base_url, api_key, model


def reply_settings(settings: JudgeSettings) -> dict[str, Any]:
    """The settings that change a reply, and so belong in the cache key."""
    return {
        k: getattr(settings, k) for k in ("temperature", "seed", "max_tokens", "json_mode", "prompt_version")
    }


class LLMJudge:
    def __init__(
        self,
        settings: JudgeSettings,
        cache: JudgeCache,
        put_evidence: Callable[[Evidence], None],
        *,
        images: bool = True,
        repeat: int = 0,
    ):
        ep = endpoint(settings)
        if ep is None:
            raise UsageError(
                "--judge llm needs an endpoint: set AMB_JUDGE_BASE_URL and AMB_JUDGE_MODEL "
                "(and AMB_JUDGE_API_KEY), or judge.base_url and judge.model in the profile"
            )
        self.base_url, api_key, self.model = ep
        self.settings = settings
        self.repeat = repeat
        # Repeat r > 0 asks the same question again: its own cache entry and, with a seed, seed + r
        # (an endpoint that honours seeds would otherwise answer identically). Repeat 0 is exactly
        # the single-run judge, so its cache is shared with ordinary scoring.
        self.key_settings = reply_settings(settings) | ({"repeat": repeat} if repeat else {})
        self.seed = None if settings.seed is None else settings.seed + repeat
        self.cache = cache
        self.put_evidence = put_evidence
        self.images = images
        self.label = f"llm:{self.model}" + (f"#r{repeat}" if repeat else "")
        self.requests = 0
        self._count = threading.Lock()
        import openai  # (here: the client takes a second to import, which the offline judge never needs)

        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
        )

    def judge(
        self, traj: Trajectory, evidence: Evidence, items: list[RubricItem], *, track: str | None
    ) -> dict[str, Verdict]:
        out: dict[str, Verdict] = {}
        allowed = set(evidence.cited_ids)
        stored = False
        for item in items:
            msgs = build_messages(item, traj.tier, evidence, self.settings.prompt_version, images=self.images)
            key = call_key(msgs, self.model, self.key_settings)
            hit = self.cache.get(key)
            if hit is not None:
                out[item.id] = self._verdict(item.id, hit, cached=True)
                continue
            if not stored:
                self.put_evidence(evidence)
                stored = True
            stored_msgs = build_messages(
                item, traj.tier, evidence, self.settings.prompt_version, images=self.images, placeholder=True
            )

            def parse(text: str, item: RubricItem = item):
                return (*parse_verdict(text, item.id, item.values, allowed), None)

            record = self._call(key, msgs, stored_msgs, item.id, traj, evidence, parse)
            self.cache.add(record)
            out[item.id] = self._verdict(item.id, record, cached=False)
        return out

    def _verdict(self, item_id: str, r: CallRecord, *, cached: bool) -> Verdict:
        return Verdict(
            item=item_id,
            value=r.value,
            reason=r.reason,
            cited=list(r.cited),
            judge=self.label,
            unscored_reason=r.unscored_reason,
            call_key=r.key,
            cached=cached,
        )

    def codes(self, traj: Trajectory, evidence: Evidence) -> tuple[list[dict[str, Any]], str | None]:
        """Error codes E1–E5 from the judge (one cached call per run): (codes, unscored reason)."""
        if not self.settings.error_codes:
            return [], None
        msgs = codes_messages(evidence)
        key = call_key(msgs, self.model, self.key_settings)
        hit = self.cache.get(key)
        if hit is None:
            self.put_evidence(evidence)
            allowed = set(evidence.cited_ids)

            def parse(text: str):
                codes, unscored = parse_codes(text, allowed)
                return None, "", [], unscored, codes

            hit = self._call(
                key, msgs, codes_messages(evidence, placeholder=True), "codes", traj, evidence, parse
            )
            self.cache.add(hit)
        return list(hit.codes or []), hit.unscored_reason

    def ask(
        self,
        item: str,
        messages: Callable[[str], list[dict[str, Any]]],
        parse: Callable[[str, set[str]], tuple[Any, str, list[str], str | None]],
        traj: Trajectory,
        evidence: Evidence,
    ) -> CallRecord:
        """Ask one question (not a rubric item) over one run's evidence: ``messages(text)`` is the
        question with ``text`` where the evidence goes; ``parse(reply, citable ids)`` gives (answer,
        explanation, cited ids, unscored reason). Cached by the question with the evidence's digest
        in place of its text, the model and the settings: asked again over the same evidence, it
        makes no request. The record keeps the answer as canonical JSON in ``answer`` (None when
        unscored; ``unscored_reason`` says why) and is stored under ``item``."""
        stored = messages(EVIDENCE_PLACEHOLDER % evidence.sha256)
        key = call_key(stored, self.model, self.key_settings)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        self.put_evidence(evidence)
        allowed = set(evidence.cited_ids)

        def parsed(text: str) -> _Parsed:
            answer, why, cited, unscored = parse(text, allowed)
            return _Parsed(
                None, why, cited, unscored, answer=None if unscored else canonical_json(answer).decode()
            )

        record = self._call(key, messages(evidence.text), stored, item, traj, evidence, parsed)
        self.cache.add(record)
        return record

    def _call(
        self,
        key: str,
        msgs: list[dict[str, Any]],
        stored_msgs: list[dict[str, Any]],
        item_id: str,
        traj: Trajectory,
        evidence: Evidence,
        parse: Callable[[str], tuple],
    ) -> CallRecord:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": msgs,
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        }
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if self.settings.json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        with self._count:
            self.requests += 1
        import openai

        t0 = time.perf_counter()
        try:
            completion = self.client.chat.completions.create(**kwargs)
        except (openai.OpenAIError, ValueError) as e:
            a = _failure(e)
        else:
            a = _answer(completion, parse)
        return CallRecord(
            key=key,
            model=self.model,
            settings=self.key_settings,
            item=item_id,
            run_id=traj.run_id,
            evidence_sha256=evidence.sha256,
            request=kwargs | {"messages": stored_msgs},
            response=a.response,
            reply_text=a.text,
            value=a.value,
            reason=a.reason,
            cited=a.cited,
            unscored_reason=a.unscored,
            cacheable=a.cacheable,
            latency_ms=(time.perf_counter() - t0) * 1000,
            codes=a.codes,
            answer=a.answer,
        )


class _Answer(NamedTuple):
    """What one judge call came to: a verdict (or codes), or why it is unscored."""

    value: float | None
    reason: str
    cited: list[str]
    unscored: str | None
    response: str
    """The endpoint's reply as it came (the completion's JSON, an error body or message)."""
    text: str = ""
    codes: list[dict[str, Any]] | None = None
    cacheable: bool = True
    answer: str | None = None


class _Parsed(NamedTuple):
    """What a parse made of a reply: a verdict's value, or the codes, or a question's answer."""

    value: float | None
    reason: str
    cited: list[str]
    unscored: str | None
    codes: list[dict[str, Any]] | None = None
    answer: str | None = None


def _failure(e: Exception) -> _Answer:
    """A call that got no completion: unscored, and not cached (the next rescore asks again)."""
    import openai

    if isinstance(e, openai.APITimeoutError):
        return _Answer(None, f"judge call timed out: {e}", [], "timeout", str(e), cacheable=False)
    if isinstance(e, openai.APIConnectionError):
        return _Answer(None, f"cannot reach the judge: {e}", [], "connection_error", str(e), cacheable=False)
    if isinstance(e, openai.APIStatusError):
        body = e.response.text if e.response is not None else str(e)
        why = f"judge endpoint answered HTTP {e.status_code}"
        return _Answer(None, why, [], f"http_{e.status_code}", body, cacheable=False)
    # A 200 whose body is not a chat completion (a proxy's HTML page, a truncated body).
    why = f"unreadable judge response: {type(e).__name__}: {e}"
    return _Answer(None, why, [], "bad_response", str(e), cacheable=False)


def _answer(completion: Any, parse: Callable[[str], tuple]) -> _Answer:
    """A completion's reply parsed by ``parse``, or unscored when the judge refused."""
    response = completion.model_dump_json()
    choice = completion.choices[0] if completion.choices else None
    msg = choice.message if choice else None
    text = (msg.content or "") if msg else ""
    refusal = getattr(msg, "refusal", None) if msg else None
    if refusal or (choice is not None and choice.finish_reason == "content_filter"):
        return _Answer(
            None, f"the judge refused: {refusal or 'content_filter'}", [], "refusal", response, text
        )
    p = _Parsed(*parse(text))
    return _Answer(p.value, p.reason, p.cited, p.unscored, response, text, p.codes, answer=p.answer)
