"""ROUGE-L (longest common subsequence F-measure), the COCO caption toolkit's variant by default.

As ``pycocoevalcap``'s ``Rouge``: LCS-based precision and recall against each reference, the maximum
of each over references, and an F-measure with ``beta = 1.2``; the corpus value is the mean of the
per-segment values. ``rouge_score``'s ``rougeL`` is the same LCS with ``beta = 1``, so ``lcs_f``
takes ``beta``. The validity rules bound every scored text, so the O(n·m) LCS is bounded too.
"""

from __future__ import annotations

from collections.abc import Sequence

COCO_BETA = 1.2


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b, start=1):
            above = row[j]
            if x == y:
                row[j] = prev_diag + 1
            elif row[j - 1] > above:
                row[j] = row[j - 1]
            prev_diag = above
    return row[-1]


def lcs_f(hyp_tokens: Sequence[str], refs_tokens: Sequence[Sequence[str]], beta: float = COCO_BETA) -> float:
    """ROUGE-L F-measure of one hypothesis against one or more references (COCO's max-P, max-R)."""
    if not hyp_tokens or not refs_tokens:
        return 0.0
    lcs = [lcs_length(ref, hyp_tokens) for ref in refs_tokens]
    p = max(n / len(hyp_tokens) for n in lcs)
    r = max(n / len(ref) if ref else 0.0 for n, ref in zip(lcs, refs_tokens, strict=True))
    if p == 0 or r == 0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * p * r / (r + b2 * p)


def coco_tokens(text: str) -> list[str]:
    """COCO's tokenisation for ROUGE-L: split on single spaces, empty tokens dropped.

    (pycocoevalcap splits on ``" "`` and so keeps empty strings for double spaces; the report
    preprocessing collapses spaces first, so dropping them changes nothing there.)
    """
    return [t for t in text.split(" ") if t]


def rouge_l(hypothesis: str, references: Sequence[str], beta: float = COCO_BETA) -> float:
    """ROUGE-L of one segment with COCO tokenisation."""
    return lcs_f(coco_tokens(hypothesis), [coco_tokens(r) for r in references], beta)
