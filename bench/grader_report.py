"""bench/grader, report part: the 7-part report score on N reports beside the reference libraries.

Reports: N synthetic chest X-ray FINDINGS (the mimic-cxr-report twin) as references, and the same
studies' findings from a different seed as hypotheses, so the pairs share vocabulary and structure
but disagree on findings, as a real model's output does.

Measured in this process, on the same prepared text (MLRG's ``'.' -> ' .'``):
- ours: ``scorer.metrics.text.report_score`` at corpus and case level (BLEU, METEOR 1.5 through one
  long-lived JVM, ROUGE-L, and the rule-based RadGraph / CheXbert substitutes: the model weights
  are absent here);
- baseline: pycocoevalcap ``Bleu(4)``, ``Meteor()`` and ``Rouge()``, what the reference code runs for
  the three NLG parts, plus rouge-score's ``rougeL``;
- the largest difference between our BLEU-1..4 / METEOR / ROUGE-L and pycocoevalcap's.

Run: ./just bench grader --only report [--reports 500]
"""

from __future__ import annotations

import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.measure import timed
from scorer.metrics import meteor as _meteor
from scorer.metrics import text
from tasks import synth
from tasks.registry import load_spec


def report_pairs(n: int) -> tuple[list[str], list[str]]:
    spec = load_spec("mimic-cxr-report")
    with tempfile.TemporaryDirectory() as tmp:
        synth.synth(spec, Path(tmp) / "ref", n, seed=0)
        synth.synth(spec, Path(tmp) / "hyp", n, seed=1)
        refs = [(Path(tmp) / "ref/private" / spec.case_id(i) / "report.txt").read_text() for i in range(n)]
        hyps = [(Path(tmp) / "hyp/private" / spec.case_id(i) / "report.txt").read_text() for i in range(n)]
    return hyps, refs


def bench_report(n_reports: int = 500) -> dict:
    hyps, refs = report_pairs(n_reports)
    words = sum(len(h.split()) + len(r.split()) for h, r in zip(hyps, refs, strict=False)) / (2 * n_reports)
    print(
        f"Report score on {n_reports} synthetic chest X-ray FINDINGS pairs ({words:.0f} words a report "
        "on average):"
    )

    _, t_jvm = timed(lambda: _meteor.meteor(["warm up"], [["warm up"]]))
    corpus, t_corpus = timed(lambda: text.report_score(hyps, refs, level="corpus"))
    case, t_case = timed(lambda: text.report_score(hyps, refs, level="case"))
    print(
        f"  ours, corpus level  {t_corpus:6.2f} s  score {corpus.score:.4f}  "
        f"({', '.join(f'{k} {v:.3f}' for k, v in corpus.components.items())})"
    )
    print(f"  ours, case level    {t_case:6.2f} s  score {case.score:.4f}")
    print(f"  (+ {t_jvm:.1f} s once per process to start the METEOR JVM; backends {corpus.backends})")

    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from rouge_score import rouge_scorer

    gts = {i: [text.prepare(r)] for i, r in enumerate(refs)}
    res = {i: [text.prepare(h)] for i, h in enumerate(hyps)}
    (bleu_ref, _), t_bleu = timed(lambda: Bleu(4).compute_score(gts, res, verbose=0))
    meteor_lib = Meteor()
    # Its JVM loads lazily on the first request: time that warm-up apart, as for ours.
    _, t_meteor_start = timed(partial(meteor_lib.compute_score, {0: ["warm up"]}, {0: ["warm up"]}))
    (meteor_ref, _), t_meteor = timed(partial(meteor_lib.compute_score, gts, res))
    del meteor_lib
    (rouge_ref, _), t_rouge = timed(lambda: Rouge().compute_score(gts, res))
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    _, t_rs = timed(lambda: [scorer.score(r, h) for h, r in zip(hyps, refs, strict=False)])
    t_lib = t_bleu + t_meteor + t_rouge
    print(
        f"  pycocoevalcap BLEU {t_bleu:.2f} s + METEOR {t_meteor:.2f} s (+ {t_meteor_start:.1f} s JVM start) "
        f"+ ROUGE-L {t_rouge:.2f} s = {t_lib:.2f} s for the three NLG parts; rouge-score rougeL {t_rs:.2f} s"
    )
    diffs = {
        "BLEU": max(
            abs(a - b)
            for a, b in zip([corpus.extras[f"BLEU_{k}"] for k in range(1, 5)], bleu_ref, strict=False)
        ),
        "METEOR": abs(corpus.components["METEOR"] - meteor_ref),
        "ROUGE_L": abs(corpus.components["ROUGE_L"] - float(rouge_ref)),
    }
    print("  max |ours - pycocoevalcap|: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    print(f"  ratio (all 7 parts, ours) / (3 NLG parts, pycocoevalcap): {t_corpus / t_lib:.2f}")
    _meteor.shutdown()
    return {
        "n": n_reports,
        "ours_corpus_s": t_corpus,
        "ours_case_s": t_case,
        "jvm_start_s": t_jvm,
        "pycocoevalcap_s": t_lib,
        "rouge_score_s": t_rs,
        "max_abs_diff": diffs,
        "score": corpus.score,
    }


def report_row(res: dict) -> tuple[str, str, str, str]:
    """The README's row of ``bench_report``'s result: id, measure, figure, baseline."""
    return (
        "report",
        f"report score on {res['n']} reports (all 7 parts)",
        f"{res['ours_case_s']:.1f} s case level, {res['ours_corpus_s']:.1f} s corpus level "
        f"(+ {res['jvm_start_s']:.0f} s to start METEOR's JVM, once)",
        f"pycocoevalcap's BLEU, METEOR and ROUGE-L alone: {res['pycocoevalcap_s']:.1f} s",
    )
