"""Report metrics: hand-computed fixtures for every part, and cross-checks against the reference
libraries (pycocoevalcap for BLEU, METEOR and ROUGE-L; rouge-score for ROUGE-L with beta 1;
NLTK's METEOR for the pure-Python fallback)."""

from __future__ import annotations

import math
import random

import pytest

from scorer.metrics import bleu, chexpert_rules, meteor, radgraph_proxy, rouge, text

WORDS = (
    "the heart size is normal . there is a small left right pleural effusion no pneumothorax "
    "focal consolidation lungs are clear mild cardiomegaly , with edema of the lower lobe"
).split()


def _pairs(n: int, seed: int = 7) -> tuple[list[str], list[str]]:
    """Random reference sentences and perturbed hypotheses (drops, swaps, substitutions, repeats)."""
    rng = random.Random(seed)
    hyps, refs = [], []
    for _ in range(n):
        ref = [rng.choice(WORDS) for _ in range(rng.randint(3, 30))]
        hyp = list(ref)
        for _ in range(rng.randint(0, 8)):
            op = rng.random()
            k = rng.randrange(len(hyp)) if hyp else 0
            if op < 0.3 and len(hyp) > 1:
                del hyp[k]
            elif op < 0.6:
                hyp.insert(k, rng.choice(WORDS))
            elif hyp:
                hyp[k] = rng.choice(WORDS)
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp) or "the")
    return hyps, refs


# --- BLEU ---------------------------------------------------------------------------------------------


def sentence_bleu(hypothesis: str, references: list[str]) -> list[float]:
    """BLEU-1..4 of one segment, as the report score computes a case's."""
    return bleu.bleu_from_stats(bleu.segment_stats(hypothesis, references))


def corpus_bleu(hypotheses: list[str], references: list[list[str]]) -> list[float]:
    """Corpus BLEU-1..4, as the report score pools its cases' counts."""
    return bleu.bleu_from_stats(
        bleu.sum_stats([bleu.segment_stats(h, r) for h, r in zip(hypotheses, references, strict=True)])
    )


def test_bleu_hand_computed():
    # hyp "the cat sat on the mat" vs ref "the cat is on the mat" (equal lengths, no brevity penalty):
    # clipped matches 5/6, 3/5, 1/4, 0/3
    b = sentence_bleu("the cat sat on the mat", ["the cat is on the mat"])
    assert b[0] == pytest.approx(5 / 6, rel=1e-8)
    assert b[1] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), rel=1e-8)
    assert b[2] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3), rel=1e-8)
    # no 4-gram match: the 1e-15 smoothing keeps it finite and tiny, not zero
    assert 0 < b[3] < 1e-3
    assert b[3] == pytest.approx((0.125 * 1e-15 / 3) ** 0.25, rel=1e-6)


def test_bleu_brevity_penalty_and_identity():
    b = sentence_bleu("the cat", ["the cat sat on the mat"])
    assert b[0] == pytest.approx(math.exp(1 - 6 / 2), rel=1e-8)
    same = sentence_bleu("a b c d e", ["a b c d e"])
    assert all(x == pytest.approx(1.0, abs=1e-8) for x in same)
    # several references: the closest length (ties to the shorter) sets the brevity penalty
    s = bleu.segment_stats("a b c", ["a b c d e f", "a b", "a b c d"])
    assert s.ref_len == 2


def test_corpus_bleu_pools_counts():
    hyps, refs = ["a b c d", "x y"], [["a b c d"], ["x z"]]
    pooled = corpus_bleu(hyps, refs)
    # pooled unigrams: (4 + 1) / (4 + 2)
    assert pooled[0] == pytest.approx(5 / 6, rel=1e-8)
    mean_of_sentences = (sentence_bleu("a b c d", ["a b c d"])[0] + sentence_bleu("x y", ["x z"])[0]) / 2
    assert pooled[0] != pytest.approx(mean_of_sentences)


def test_bleu_matches_pycocoevalcap():
    from pycocoevalcap.bleu.bleu import Bleu

    hyps, refs = _pairs(60)
    gts = {i: [r] for i, r in enumerate(refs)}
    res = {i: [h] for i, h in enumerate(hyps)}
    ref_corpus, ref_segments = Bleu(4).compute_score(gts, res, verbose=0)
    ours = corpus_bleu(hyps, [[r] for r in refs])
    assert ours == pytest.approx(ref_corpus, rel=1e-12)
    for i, (h, r) in enumerate(zip(hyps, refs, strict=False)):
        assert sentence_bleu(h, [r]) == pytest.approx([ref_segments[k][i] for k in range(4)], rel=1e-12)


# --- ROUGE-L ------------------------------------------------------------------------------------------


def test_rouge_l_hand_computed():
    # LCS("a b c d", "a c b d e") = 3: P = 3/4, R = 3/5
    p, r = 0.75, 0.6
    assert rouge.lcs_length("a b c d".split(), "a c b d e".split()) == 3
    assert rouge.rouge_l("a b c d", ["a c b d e"]) == pytest.approx((1 + 1.44) * p * r / (r + 1.44 * p))
    assert rouge.lcs_f("a b c d".split(), ["a c b d e".split()], beta=1.0) == pytest.approx(
        2 * p * r / (p + r)
    )
    assert rouge.rouge_l("", ["a"]) == 0.0
    assert rouge.rouge_l("x y", ["a b"]) == 0.0
    assert rouge.rouge_l("a b", ["a b"]) == 1.0


def test_rouge_l_matches_pycocoevalcap():
    from pycocoevalcap.rouge.rouge import Rouge

    hyps, refs = _pairs(60, seed=3)
    avg, per = Rouge().compute_score(
        {i: [r] for i, r in enumerate(refs)}, {i: [h] for i, h in enumerate(hyps)}
    )
    ours = [rouge.rouge_l(h, [r]) for h, r in zip(hyps, refs, strict=False)]
    # COCO's corpus ROUGE-L is the mean of the per-segment values
    assert sum(ours) / len(ours) == pytest.approx(float(avg), rel=1e-12)
    assert ours == pytest.approx([float(x) for x in per], rel=1e-12)


def test_rouge_l_beta_one_matches_rouge_score():
    import re

    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)

    def toks(s: str) -> list[str]:  # rouge-score's tokenizer without stemming
        return re.sub(r"[^a-z0-9]+", " ", s.lower()).split()

    hyps, refs = _pairs(60, seed=11)
    for h, r in zip(hyps, refs, strict=False):
        expected = scorer.score(r, h)["rougeL"].fmeasure
        assert rouge.lcs_f(toks(h), [toks(r)], beta=1.0) == pytest.approx(expected, abs=1e-12)


# --- METEOR -------------------------------------------------------------------------------------------


def test_meteor_fallback_hand_computed():
    # "a b c d" vs "a b c d e": 4 matches in 1 chunk, P = 1, R = 0.8
    fmean = 0.8 / (0.9 * 1 + 0.1 * 0.8)
    expected = fmean * (1 - 0.5 * (1 / 4) ** 3)
    corpus, segs = meteor.python_meteor(["a b c d"], [["a b c d e"]])
    assert segs[0] == pytest.approx(expected)
    assert corpus == pytest.approx(expected)
    # two chunks: "a b" and "d e" -> penalty 0.5 * (2/4)^3
    _, segs = meteor.python_meteor(["a b x d e"], [["a b y d e"]])
    p = r = 4 / 5
    assert segs[0] == pytest.approx(p * r / (0.9 * p + 0.1 * r) * (1 - 0.5 * (2 / 4) ** 3))


def test_meteor_fallback_matches_nltk():
    from nltk.translate.meteor_score import meteor_score

    class NoWordNet:
        def synsets(self, *args, **kwargs):
            return []

    class Identity:
        def stem(self, word):
            return word

    hyps, refs = _pairs(80, seed=5)
    _, segs = meteor.python_meteor(hyps, [[r] for r in refs])
    for h, r, ours in zip(hyps, refs, segs, strict=False):
        expected = meteor_score(
            [r.split()], h.split(), preprocess=str.lower, stemmer=Identity(), wordnet=NoWordNet()
        )
        assert ours == pytest.approx(expected, abs=1e-12), (h, r)


def test_meteor_segment_cleaning():
    assert meteor.clean_segment("a ||| b\nc\x00d\t e") == "a b c d e"


def test_java_meteor_matches_pycocoevalcap():
    # The machine has Java 17 and the pycocoevalcap wheel carries the jar; without them the grader
    # would only be degraded, but this test must then fail loudly rather than skip.
    assert meteor.java_available() is None, meteor.java_available()
    from pycocoevalcap.meteor.meteor import Meteor

    hyps, refs = _pairs(25, seed=9)
    ours = meteor.meteor(hyps, [[r] for r in refs])
    assert ours.impl == "java-meteor-1.5"
    theirs = Meteor()
    try:
        corpus, segs = theirs.compute_score(
            {i: [r] for i, r in enumerate(refs)}, {i: [h] for i, h in enumerate(hyps)}
        )
    finally:
        del theirs
    assert ours.corpus == pytest.approx(corpus, abs=1e-9)
    assert ours.segments == pytest.approx(segs, abs=1e-9)
    # identical text is a perfect METEOR 1.5 score (one chunk, no fragmentation penalty)
    assert meteor.meteor(["the heart is normal ."], [["the heart is normal ."]]).segments == [1.0]


def test_meteor_falls_back_when_java_is_disabled():
    result = meteor.meteor(["a b c d"], [["a b c d e"]], use_java=False)
    assert result.impl == "python-exact" and "disabled" in result.note
    assert result.segments[0] == pytest.approx(meteor.python_meteor(["a b c d"], [["a b c d e"]])[1][0])


def test_meteor_falls_back_when_the_jar_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("AMB_METEOR_JAR", str(tmp_path / "nope.jar"))
    result = meteor.meteor(["a b"], [["a b"]])
    assert result.impl == "python-exact" and "meteor-1.5.jar" in result.note


def test_meteor_empty_segments_score_zero():
    result = meteor.meteor(["", "  "], [["a b"], ["c"]], use_java=False)
    assert result.corpus == 0.0 and result.segments == [0.0, 0.0]


# --- CheXpert-style labels ----------------------------------------------------------------------------


def _positives(report: str) -> set[str]:
    return {k for k, v in chexpert_rules.label_report(report).items() if v}


def test_chexpert_rules_negation_uncertainty_and_no_finding():
    assert _positives("The lungs are clear. No pleural effusion or pneumothorax.") == {"No Finding"}
    assert _positives("Small left pleural effusion. No pneumothorax.") == {"Pleural Effusion"}
    # uncertain counts as positive (CheXbert's rrg mode); negation in one clause does not leak
    assert _positives("No effusion, but possible right lower lobe pneumonia.") == {"Pneumonia"}
    assert _positives("Pneumothorax cannot be excluded.") == {"Pneumothorax"}
    assert _positives("The cardiac silhouette is mildly enlarged.") == {"Cardiomegaly"}
    # support devices alone keep No Finding
    assert _positives("Endotracheal tube in place. Lungs are clear.") == {"Support Devices", "No Finding"}


def test_micro_prf_hand_computed():
    labels = chexpert_rules.CHEXPERT_LABELS
    z = dict.fromkeys(labels, 0)
    hyp = [{**z, "Cardiomegaly": 1, "Edema": 1}, {**z, "No Finding": 1}]
    ref = [{**z, "Cardiomegaly": 1}, {**z, "Pleural Effusion": 1}]
    r = chexpert_rules.micro_prf(hyp, ref)  # tp 1, fp 2 (Edema, No Finding), fn 1 (Effusion)
    assert (r.tp, r.fp, r.fn) == (1, 2, 1)
    assert r.precision == pytest.approx(1 / 3) and r.recall == pytest.approx(1 / 2)
    assert r.f1 == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert chexpert_rules.micro_prf([z], [z]).f1 == 1.0  # nothing to find on either side


# --- RadGraph substitute --------------------------------------------------------------------------------


def test_radgraph_proxy_graph_and_partial_reward():
    g = radgraph_proxy.extract_graph("Small left pleural effusion. No pneumothorax.")
    items = radgraph_proxy.partial_items(g)
    assert ("pneumothorax", "OBS-DA") in items
    assert ("left", "OBS-DP", "modify", "pleural effusion") in items
    assert radgraph_proxy.partial_reward(g, g) == 1.0
    # hyp items {pneumothorax OBS-DA}; ref adds 3 more: P = 1, R = 1/4 -> F1 = 0.4
    hyp = radgraph_proxy.extract_graph("No pneumothorax.")
    assert len(items) == 4
    assert radgraph_proxy.partial_reward(hyp, g) == pytest.approx(0.4)
    empty = radgraph_proxy.extract_graph("Thanks.")
    assert radgraph_proxy.partial_reward(empty, empty) == 1.0
    assert radgraph_proxy.partial_reward(empty, g) == 0.0


def test_radgraph_proxy_negation_changes_the_label():
    pos = radgraph_proxy.extract_graph("There is a pneumothorax.")
    neg = radgraph_proxy.extract_graph("There is no pneumothorax.")
    assert radgraph_proxy.partial_reward(pos, neg) == 0.0


# --- sections, validity and the combined score -----------------------------------------------------------


def test_findings_section_extraction():
    report = "EXAMINATION: CHEST\nINDICATION: cough\nFINDINGS: Lungs are clear.\nIMPRESSION: Normal."
    assert text.scored_text(report, "findings") == "Lungs are clear."
    assert text.scored_text(report, "full") == report
    assert text.scored_text("Lungs are clear. No effusion.", "findings") == "Lungs are clear. No effusion."
    # an empty FINDINGS section falls back to the whole text
    assert text.scored_text("FINDINGS:\nIMPRESSION: x", "findings") == "FINDINGS:\nIMPRESSION: x"
    # "FINDINGS AND IMPRESSION" is an impression alias, not findings
    assert "findings" not in text.split_sections("FINDINGS AND IMPRESSION: clear.")


def test_validity_rules():
    rules = text.Validity()
    assert text.validity_errors("The lungs are clear. No pleural effusion or pneumothorax.", rules) == []
    assert any("too short" in e for e in text.validity_errors("Clear.", rules))
    assert any("too long" in e for e in text.validity_errors("a" * 8001, rules))
    assert any("letters" in e for e in text.validity_errors("1234567890 " * 5, rules))
    assert any(
        "non-printable" in e
        for e in text.validity_errors("Lungs are clear — no effusion, no pneumothorax today.", rules)
    )
    lenient = text.Validity(min_chars=1, min_letters=1, printable_ascii=False)
    assert text.validity_errors("Fibrose — é", lenient) == []
    assert text.validity_errors("   ", lenient)


def test_prepare_matches_mlrg_preprocessing():
    assert text.prepare("Heart  normal.No effusion.\n") == "Heart normal .No effusion ."


def test_report_score_levels_and_identity():
    refs = [
        "The lungs are clear. Heart size is normal. No pleural effusion or pneumothorax.",
        "Small left pleural effusion. Mild cardiomegaly. No pneumothorax.",
    ]
    hyps = ["The lungs are clear. The heart is normal in size. No effusion.", refs[1]]
    case = text.report_score(hyps, refs, level="case", use_java=False)
    corpus = text.report_score(hyps, refs, level="corpus", use_java=False)
    assert case.cases[1]["ROUGE_L"] == 1.0
    assert case.score == pytest.approx(sum(c["score"] for c in case.cases) / 2)
    assert corpus.score == pytest.approx(sum(corpus.components.values()) / 7)
    assert case.score != pytest.approx(corpus.score)
    assert any(d.startswith("METEOR") for d in case.degraded)
    assert any(d.startswith("F1RadGraph") for d in case.degraded)
    assert any(d.startswith("CheXbert") for d in case.degraded)
    assert case.backends["CheXbert"] == "chexpert-rules"
    same = text.report_score(refs, refs, level="case")
    assert same.score == pytest.approx(1.0)
    with pytest.raises(ValueError):
        text.report_score(["a"], ["a"], level="document")


def test_model_weights_are_never_fetched(monkeypatch, tmp_path):
    # A configured but empty model folder is not "present": the substitute runs, nothing is downloaded.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # restored after the test
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("AMB_RADGRAPH_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("AMB_CHEXBERT_PATH", str(tmp_path / "chexbert.pth"))
    monkeypatch.setenv("AMB_BERT_PATH", str(tmp_path))
    result = text.report_score(["No pneumothorax."], ["No pneumothorax."], use_java=False)
    assert result.backends["CheXbert"] == "chexpert-rules"
    assert result.backends["F1RadGraph"] == "radgraph-proxy-rules"
    import os

    assert os.environ.get("HF_HUB_OFFLINE") == "1"


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("exec sleep 30", "no answer within"),  # a JVM that hangs
        ("exit 3", "exited|closed its input"),  # a JVM that dies at start (seen on read or on write)
        ("while read l; do echo garbage; done", "non-number"),  # a JVM that answers nonsense
    ],
)
def test_a_broken_jvm_falls_back_within_the_deadline(monkeypatch, tmp_path, script, why):
    import re
    import time

    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    meteor.shutdown()  # drop a real JVM cached by an earlier test
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    try:
        t0 = time.monotonic()
        result = meteor.meteor(["a b c d"], [["a b c d e"]], timeout=2.0)
        assert time.monotonic() - t0 < 10
        assert result.impl == "python-exact" and re.search(why, result.note), result.note
    finally:
        meteor.shutdown()
