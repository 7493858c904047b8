"""BLEU-1..4 as the COCO caption toolkit computes it (what the report-score reference code calls).

Why not sacrebleu or NLTK: the common implementations disagree by several points on the same input,
and AutoMedBench's report score goes through ``pycocoevalcap``'s ``Bleu(4)``. This module
re-implements that definition (the tests cross-check it): whitespace tokens, clipped n-gram counts,
COCO's effective reference length, its smoothing constants (so a hypothesis without any 4-gram match
scores ~0 instead of dividing by zero) and brevity penalty. **Corpus** BLEU sums the counts over all
segments before the geometric mean (not a mean of sentence BLEUs).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import msgspec

TINY = 1e-15
SMALL = 1e-9


class BleuStats(msgspec.Struct, frozen=True):
    """Sufficient statistics of one segment (or a sum of segments)."""

    hyp_len: int
    ref_len: float
    guess: tuple[int, ...]
    correct: tuple[int, ...]


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    out: Counter[tuple[str, ...]] = Counter()
    for k in range(1, n + 1):
        for i in range(len(tokens) - k + 1):
            out[tuple(tokens[i : i + k])] += 1
    return out


def segment_stats(hypothesis: str, references: Sequence[str], n: int = 4) -> BleuStats:
    """Clipped n-gram matches, n-gram guesses and effective reference length of one segment."""
    hyp = hypothesis.split()
    refs = [r.split() for r in references] or [[]]
    max_ref: Counter[tuple[str, ...]] = Counter()
    for r in refs:
        max_ref |= _ngrams(r, n)  # each n-gram's highest count in any one reference
    correct = [0] * n
    for gram, count in _ngrams(hyp, n).items():
        correct[len(gram) - 1] += min(count, max_ref.get(gram, 0))
    guess = tuple(max(0, len(hyp) - k + 1) for k in range(1, n + 1))
    lens = [len(r) for r in refs]
    # One reference: its length; several: the closest to the hypothesis, ties to the shorter.
    ref_len = float(lens[0]) if len(lens) == 1 else float(min(lens, key=lambda x: (abs(x - len(hyp)), x)))
    return BleuStats(len(hyp), ref_len, guess, tuple(correct))


def bleu_from_stats(stats: BleuStats) -> list[float]:
    """BLEU-1..n from (summed) statistics."""
    n = len(stats.guess)
    scores = []
    product = 1.0
    for k in range(n):
        product *= (stats.correct[k] + TINY) / (stats.guess[k] + SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    ratio = (stats.hyp_len + TINY) / (stats.ref_len + SMALL)
    if ratio < 1:
        penalty = math.exp(1 - 1 / ratio)
        scores = [s * penalty for s in scores]
    return scores


def sum_stats(all_stats: Sequence[BleuStats]) -> BleuStats:
    """The corpus statistics: every count and length summed over segments."""
    n = len(all_stats[0].guess) if all_stats else 4
    return BleuStats(
        sum(s.hyp_len for s in all_stats),
        sum((s.ref_len for s in all_stats), 0.0),
        tuple(sum(s.guess[k] for s in all_stats) for k in range(n)),
        tuple(sum(s.correct[k] for s in all_stats) for k in range(n)),
    )
