"""The 7-part report score, FINDINGS extraction and the report validity rules.

The parts, the text preparation (MLRG's ``compute_nlg_scores``; we also fold newlines and tabs into
spaces and strip the ends, which the reference's whitespace tokenisation treats the same way), the
two levels (``GradeOptions.text_level``) and the model-based parts' substitutes (each listed in
``degraded``, so nobody compares the number with published ones) are described in
docs/vqa-and-report.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from scorer.metrics import bleu as _bleu
from scorer.metrics import chexpert_rules, radgraph_proxy
from scorer.metrics import meteor as _meteor
from scorer.metrics import rouge as _rouge
from tasks.report_text import Validity as Validity  # (re-exported with validity_errors)
from tasks.report_text import split_sections
from tasks.report_text import validity_errors as validity_errors

COMPONENTS: tuple[str, ...] = (
    *("BLEU", "METEOR", "ROUGE_L", "F1RadGraph"),
    *("micro_average_precision", "micro_average_recall", "micro_average_f1"),
)


def _parts(
    bleu: float, meteor: float, rouge: float, radgraph: float, prf: chexpert_rules.MicroPRF
) -> dict[str, float]:
    """The 7 components by name; ``prf`` is CheXbert's micro precision, recall and F1."""
    values = (bleu, meteor, rouge, radgraph, prf.precision, prf.recall, prf.f1)
    return dict(zip(COMPONENTS, values, strict=True))


# --- sections and validity ---------------------------------------------------------------------------


def scored_text(text: str, section: str = "findings") -> str:
    """The part of a report that is scored: the FINDINGS section when the report has a non-empty
    one and ``section == "findings"``, else the whole text."""
    if section == "findings":
        findings = split_sections(text).get("findings", "")
        if findings:
            return findings
    return text.strip()


# --- the model-based parts: real models when present, substitutes otherwise --------------------------


def _offline_env() -> None:
    """Make sure nothing that loads a model can reach the hub (set before any such import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _radgraph_model() -> tuple[Any, str] | tuple[None, str]:
    """A real ``radgraph.F1RadGraph`` if its extracted model is on disk, else (None, why not)."""
    model_dir = os.environ.get("AMB_RADGRAPH_MODEL_DIR", "")
    if not model_dir or not Path(model_dir).is_dir():
        return None, "RadGraph weights absent (AMB_RADGRAPH_MODEL_DIR unset or not a directory)"
    _offline_env()
    try:
        from radgraph import F1RadGraph

        return F1RadGraph(reward_level="partial", model_type="radgraph", model_cache_dir=model_dir), ""
    except Exception as e:  # an optional heavy stack: any failure means "use the substitute"
        return None, f"RadGraph model failed to load: {type(e).__name__}: {e}"


def _chexbert_model() -> tuple[Any, str] | tuple[None, str]:
    """A real ``f1chexbert.F1CheXbert`` if its checkpoints are on disk, else (None, why not)."""
    ckpt, bert = os.environ.get("AMB_CHEXBERT_PATH", ""), os.environ.get("AMB_BERT_PATH", "")
    if not ckpt or not Path(ckpt).is_file() or not bert or not Path(bert).exists():
        return None, "CheXbert weights absent (AMB_CHEXBERT_PATH / AMB_BERT_PATH unset or missing)"
    _offline_env()
    try:
        from f1chexbert import F1CheXbert

        return F1CheXbert(chexbert_checkpoint=ckpt, model_checkpoint=bert, tokenizer_checkpoint=bert), ""
    except Exception as e:
        return None, f"CheXbert model failed to load: {type(e).__name__}: {e}"


def _radgraph_rewards(
    hyps: Sequence[str], refs: Sequence[str], degraded: list[str]
) -> tuple[list[float], str]:
    model, why = _radgraph_model()
    if model is not None:
        try:
            _, rewards, _, _ = model(hyps=list(hyps), refs=list(refs))
            return [float(r) for r in rewards], "radgraph-model"
        except Exception as e:
            why = f"RadGraph model failed: {type(e).__name__}: {e}"
    degraded.append(f"F1RadGraph: rule-based entity/relation substitute ({why})")
    return [
        radgraph_proxy.partial_reward(radgraph_proxy.extract_graph(h), radgraph_proxy.extract_graph(r))
        for h, r in zip(hyps, refs, strict=False)
    ], "radgraph-proxy-rules"


def _chexpert_labels(texts: Sequence[str], model: Any) -> list[dict[str, int]]:
    if model is None:
        return [chexpert_rules.label_report(t) for t in texts]
    return [
        dict(zip(chexpert_rules.CHEXPERT_LABELS, (int(v) for v in model.get_label(t)), strict=False))
        for t in texts
    ]


def _chexbert_labels(hyps: Sequence[str], refs: Sequence[str], degraded: list[str]):
    model, why = _chexbert_model()
    if model is not None:
        try:
            return _chexpert_labels(hyps, model), _chexpert_labels(refs, model), "chexbert-model"
        except Exception as e:
            why = f"CheXbert model failed: {type(e).__name__}: {e}"
    degraded.append(f"CheXbert P/R/F1: rule-based CheXpert-style labeller ({why})")
    return _chexpert_labels(hyps, None), _chexpert_labels(refs, None), "chexpert-rules"


# --- the score --------------------------------------------------------------------------------------


def prepare(text: str) -> str:
    """MLRG's text preparation: ``.`` → ``" ."``, whitespace runs → one space, ends stripped."""
    return " ".join(text.replace(".", " .").split())


class ReportScore(msgspec.Struct, frozen=True, kw_only=True):
    score: float
    """Mean of the 7 components at the chosen level."""
    components: dict[str, float]
    """The 7 task-level components."""
    cases: list[dict[str, float]]
    """Per case: the 7 components of that case alone and their mean (``score``)."""
    backends: dict[str, str]
    """Which implementation produced each model-dependent component."""
    degraded: list[str]
    extras: dict[str, float] = {}
    """BLEU-1..4 at task level (diagnostics)."""


def report_score(
    hypotheses: Sequence[str], references: Sequence[str], *, level: str = "case", use_java: bool = True
) -> ReportScore:
    """The 7-part report score of aligned generated and reference texts (already section-extracted)."""
    if level not in ("case", "corpus"):
        raise ValueError(f"unknown text level {level!r} (expected case or corpus)")
    if len(hypotheses) != len(references):
        raise ValueError("report_score: hypotheses and references differ in length")
    n = len(hypotheses)
    if n == 0:
        return ReportScore(
            score=0.0, components=dict.fromkeys(COMPONENTS, 0.0), cases=[], backends={}, degraded=[]
        )
    hyps = [prepare(h) for h in hypotheses]
    refs = [prepare(r) for r in references]
    degraded: list[str] = []

    bleu_stats = [_bleu.segment_stats(h, [r]) for h, r in zip(hyps, refs, strict=False)]
    case_bleu = [sum(_bleu.bleu_from_stats(s)) / 4 for s in bleu_stats]
    corpus_bleu_n = _bleu.bleu_from_stats(_bleu.sum_stats(bleu_stats))

    met = _meteor.meteor(hyps, [[r] for r in refs], use_java=use_java)
    if met.impl != "java-meteor-1.5":
        degraded.append(f"METEOR: {met.impl} fallback, not METEOR 1.5 ({met.note})")

    case_rouge = [_rouge.rouge_l(h, [r]) for h, r in zip(hyps, refs, strict=False)]
    # The model-based parts see the raw section text, as the reference code passes it to them.
    case_radgraph, radgraph_impl = _radgraph_rewards(hypotheses, references, degraded)
    hyp_labels, ref_labels, chexbert_impl = _chexbert_labels(hypotheses, references, degraded)
    case_prf = [chexpert_rules.micro_prf([h], [r]) for h, r in zip(hyp_labels, ref_labels, strict=False)]

    cases = []
    for i in range(n):
        parts = _parts(case_bleu[i], met.segments[i], case_rouge[i], case_radgraph[i], case_prf[i])
        parts["score"] = sum(parts[c] for c in COMPONENTS) / len(COMPONENTS)
        cases.append(parts)

    if level == "case":
        components = {c: sum(case[c] for case in cases) / n for c in COMPONENTS}
        score = sum(case["score"] for case in cases) / n
    else:
        pooled = chexpert_rules.micro_prf(hyp_labels, ref_labels)
        corpus_bleu = sum(corpus_bleu_n) / 4
        components = _parts(corpus_bleu, met.corpus, sum(case_rouge) / n, sum(case_radgraph) / n, pooled)
        score = sum(components.values()) / len(COMPONENTS)
    return ReportScore(
        score=min(1.0, max(0.0, score)),
        components=components,
        cases=cases,
        backends={"METEOR": met.impl, "F1RadGraph": radgraph_impl, "CheXbert": chexbert_impl},
        degraded=degraded,
        extras={f"BLEU_{k + 1}": v for k, v in enumerate(corpus_bleu_n)},
    )
