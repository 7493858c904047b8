"""bench/grader, report part: the 7-part report score on N reports beside the reference libraries.

Reports: N synthetic chest X-ray FINDINGS (the mimic-cxr-report twin) as references, and the same
studies' findings from a different seed as hypotheses, so the pairs share vocabulary and structure
but disagree on findings, as a real model's output does.

Measured in this process, on the same prepared text (MLRG's ``'.' -> ' .'``):
- ours: ``scorer.metrics.text.report_score`` at corpus and case level (BLEU, METEOR 1.5 through one
  long-lived JVM, ROUGE-L, and the rule-based RadGraph / CheXbert substitutes: the model weights
  are absent here);
- baseline: pycocoevalcap ``Bleu(4)``, ``Meteor()`` and ``Rouge()``, what the reference code runs for
  the three NLG parts;
- the largest difference between our BLEU-1..4 / METEOR / ROUGE-L and pycocoevalcap's.

Run: ./just bench grader --only report [--reports 500]
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

from bench import figures
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
        hyps, refs = (
            [(Path(tmp) / side / "private" / spec.case_id(i) / "report.txt").read_text() for i in range(n)]
            for side in ("hyp", "ref")
        )
    return hyps, refs


def bench_report(figs: figures.Figures, n_reports: int) -> None:
    hyps, refs = report_pairs(n_reports)
    _, t_jvm = timed(lambda: _meteor.meteor(["warm up"], [["warm up"]]))
    corpus, t_corpus = timed(lambda: text.report_score(hyps, refs, level="corpus"))
    _, t_case = timed(lambda: text.report_score(hyps, refs, level="case"))

    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge

    gts = {i: [text.prepare(r)] for i, r in enumerate(refs)}
    res = {i: [text.prepare(h)] for i, h in enumerate(hyps)}
    (bleu_ref, _), t_bleu = timed(lambda: Bleu(4).compute_score(gts, res, verbose=0))
    meteor_lib = Meteor()
    # Its JVM loads lazily on the first request: that warm-up is left out, as for ours.
    meteor_lib.compute_score({0: ["warm up"]}, {0: ["warm up"]})
    (meteor_ref, _), t_meteor = timed(partial(meteor_lib.compute_score, gts, res))
    del meteor_lib
    (rouge_ref, _), t_rouge = timed(lambda: Rouge().compute_score(gts, res))
    ours_bleu = [corpus.extras[f"BLEU_{k}"] for k in range(1, 5)]
    diff = max(
        *(abs(a - b) for a, b in zip(ours_bleu, bleu_ref, strict=True)),
        abs(corpus.components["METEOR"] - meteor_ref),
        abs(corpus.components["ROUGE_L"] - float(rouge_ref)),
    )
    _meteor.shutdown()
    figs.add(
        "report",
        f"report score on {n_reports} reports (all 7 parts)",
        f"{t_case:.1f} s case level, {t_corpus:.1f} s corpus level "
        f"(+ {t_jvm:.0f} s to start METEOR's JVM, once)",
        f"pycocoevalcap's BLEU, METEOR and ROUGE-L alone: {t_bleu + t_meteor + t_rouge:.1f} s; "
        f"largest difference {diff:.1e}",
    )
