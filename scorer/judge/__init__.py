"""Judges of rubric items: the offline rule-based judge (default) and the LLM judge."""

from scorer.judge.base import Judge, Verdict

__all__ = ["Judge", "Verdict"]
