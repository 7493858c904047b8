"""METEOR: the real METEOR 1.5 (Java) when it can run, a pure-Python fallback otherwise.

The reference code's ``pycocoevalcap`` ``Meteor`` drives ``meteor-1.5.jar -stdio -l en -norm`` (the
jar ships in that wheel). We drive the same jar ourselves because that wrapper can block forever on
a dead pipe: here every read has a deadline, and a failed or slow JVM falls back instead of hanging.
``SCORE ||| refs... ||| hyp`` returns a line of statistics; ``EVAL ||| stats...`` one score per
segment, then the corpus score (from the summed statistics, *not* the mean of the segments). The JVM
takes ~6 s to start, so one process is kept and reused under a lock, restarted after any failure.

Fallback (``python-exact``): the original METEOR (Banerjee & Lavie 2005; NLTK's ``alpha=0.9, beta=3,
gamma=0.5``) over lower-cased exact matches with NLTK's greedy alignment, the corpus value from the
summed matches, lengths and chunks. Its scale differs from METEOR 1.5 (no stems, synonyms or
paraphrases), so the caller must report it as a substitution.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import queue
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import msgspec

JAVA_TIMEOUT_S = 120.0
"""Deadline for the JVM's first answer (start-up plus paraphrase table); later reads reuse it."""

_JVM = ("java", "-Xmx2G", "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8", "-jar")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WS = re.compile(r"\s+")


class MeteorError(Exception):
    """The Java METEOR could not produce a score (missing, crashed, timed out, garbled output)."""


class MeteorResult(msgspec.Struct, frozen=True):
    corpus: float
    segments: list[float]
    impl: str
    """``java-meteor-1.5`` or ``python-exact`` (the fallback)."""
    note: str = ""
    """Why the fallback ran, when it did."""


def clean_segment(text: str) -> str:
    """One line the jar's protocol can carry: no ``|||``, no control characters, single spaces."""
    return _WS.sub(" ", _CONTROL.sub(" ", text.replace("|||", " "))).strip()


def find_jar() -> Path | None:
    """``AMB_METEOR_JAR`` if set, else the jar inside the installed pycocoevalcap package."""
    env = os.environ.get("AMB_METEOR_JAR")
    if env:
        return Path(env) if Path(env).is_file() else None
    try:
        spec = importlib.util.find_spec("pycocoevalcap")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    jars = (Path(base) / "meteor" / "meteor-1.5.jar" for base in spec.submodule_search_locations)
    return next((jar for jar in jars if jar.is_file()), None)


def java_available() -> str | None:
    """None when the Java METEOR can be tried, else why not."""
    if shutil.which("java") is None:
        return "no java on PATH"
    if find_jar() is None:
        return "meteor-1.5.jar not found (install pycocoevalcap or set AMB_METEOR_JAR)"
    return None


class _JavaMeteor:
    """One long-lived ``meteor-1.5.jar -stdio`` process with deadline-bounded reads."""

    def __init__(self, jar: Path) -> None:
        self.proc = subprocess.Popen(
            [*_JVM, str(jar), "-", "-", "-stdio", "-l", "en", "-norm"],
            cwd=str(jar.parent),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode("utf-8", "replace").strip())
        self.lines.put(None)

    def _send(self, text: str, timeout: float) -> None:
        """Write ``text`` to the jar; a JVM that stops reading cannot block us past ``timeout``
        (the write runs in a helper thread; on the deadline the process is killed, which also ends
        the blocked write)."""
        assert self.proc.stdin is not None
        stdin = self.proc.stdin
        failure: list[BaseException] = []

        def write() -> None:
            try:
                stdin.write(text.encode("utf-8"))
                stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as e:
                failure.append(e)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(timeout)
        if writer.is_alive():
            self.close()
            raise MeteorError(f"METEOR stopped reading its input for {timeout:.0f} s")
        if failure:
            raise MeteorError(f"METEOR process closed its input: {failure[0]}")

    def _read(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise MeteorError(f"METEOR gave no answer within {timeout:.0f} s") from None
        if line is None:
            raise MeteorError(f"METEOR exited (code {self.proc.poll()})")
        return line

    def score(self, pairs: Sequence[tuple[str, Sequence[str]]], timeout: float) -> tuple[float, list[float]]:
        self._send(
            "".join("SCORE ||| " + " ||| ".join(refs) + " ||| " + hyp + "\n" for hyp, refs in pairs), timeout
        )
        stats = [self._read(timeout) for _ in pairs]
        self._send("EVAL ||| " + " ||| ".join(stats) + "\n", timeout)
        try:
            segments = [float(self._read(timeout)) for _ in pairs]
            corpus = float(self._read(timeout))
        except ValueError as e:
            raise MeteorError(f"METEOR printed a non-number: {e}") from e
        return corpus, segments

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_lock = threading.Lock()
_proc: _JavaMeteor | None = None


def _java_score(pairs: Sequence[tuple[str, Sequence[str]]], timeout: float) -> tuple[float, list[float]]:
    global _proc
    jar = find_jar()
    if jar is None or shutil.which("java") is None:
        raise MeteorError(java_available() or "java METEOR unavailable")
    with _lock:
        if _proc is None or _proc.proc.poll() is not None:
            _proc = _JavaMeteor(jar)
        try:
            return _proc.score(pairs, timeout)
        except MeteorError:
            _proc.close()
            _proc = None
            raise


def shutdown() -> None:
    """Stop the cached JVM (also run at interpreter exit; the JVM would exit on EOF anyway)."""
    global _proc
    with _lock:
        if _proc is not None:
            _proc.close()
            _proc = None


atexit.register(shutdown)


FALLBACK_ALPHA, FALLBACK_BETA, FALLBACK_GAMMA = 0.9, 3.0, 0.5


class _Align(msgspec.Struct, frozen=True):
    matches: int
    chunks: int
    hyp_len: int
    ref_len: int


def _align(hyp: list[str], ref: list[str]) -> _Align:
    """NLTK's exact-match alignment: hypothesis words from the last one backwards, each taking the
    last unused equal reference word; chunks are runs adjacent in both sentences, counted in
    hypothesis order."""
    used = [False] * len(ref)
    pairs: list[tuple[int, int]] = []
    for i in range(len(hyp) - 1, -1, -1):
        for j in range(len(ref) - 1, -1, -1):
            if not used[j] and ref[j] == hyp[i]:
                used[j] = True
                pairs.append((i, j))
                break
    pairs.sort()
    chunks = sum(1 for k, (i, j) in enumerate(pairs) if k == 0 or pairs[k - 1] != (i - 1, j - 1))
    return _Align(len(pairs), chunks, len(hyp), len(ref))


def _score_align(a: _Align) -> float:
    if a.matches == 0 or a.hyp_len == 0 or a.ref_len == 0:
        return 0.0
    p, r = a.matches / a.hyp_len, a.matches / a.ref_len
    fmean = p * r / (FALLBACK_ALPHA * p + (1 - FALLBACK_ALPHA) * r)
    penalty = FALLBACK_GAMMA * (a.chunks / a.matches) ** FALLBACK_BETA
    return fmean * (1 - penalty)


def _best_align(hyp: str, refs: Sequence[str]) -> _Align:
    h = hyp.lower().split()
    aligns = [_align(h, r.lower().split()) for r in refs] or [_Align(0, 0, len(h), 0)]
    return max(aligns, key=_score_align)


def python_meteor(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]]
) -> tuple[float, list[float]]:
    """The fallback METEOR (see the module docstring): corpus value and per-segment values."""
    aligns = [_best_align(h, r) for h, r in zip(hypotheses, references, strict=True)]
    total = _Align(*(sum(getattr(a, f) for a in aligns) for f in _Align.__struct_fields__))
    return _score_align(total), [_score_align(a) for a in aligns]


def meteor(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    use_java: bool = True,
    timeout: float = JAVA_TIMEOUT_S,
) -> MeteorResult:
    """METEOR over aligned hypotheses and reference lists: Java METEOR 1.5, else the fallback.

    Segments whose hypothesis or references are empty after cleaning score 0 and are not sent to the
    jar (METEOR 1.5 has no defined value for them).
    """
    hyps = [clean_segment(h) for h in hypotheses]
    refs = [[clean_segment(r) for r in rs] for rs in references]
    if len(hyps) != len(refs):
        raise ValueError("meteor: hypotheses and references differ in length")
    live = [i for i, (h, rs) in enumerate(zip(hyps, refs, strict=False)) if h and any(rs)]
    if not live:
        return MeteorResult(0.0, [0.0] * len(hyps), "none", "no segment with text on both sides")
    note = "java METEOR disabled"
    if use_java:
        try:
            corpus, seg = _java_score([(hyps[i], [r for r in refs[i] if r]) for i in live], timeout)
        except MeteorError as e:
            note = str(e)
        else:
            segments = [0.0] * len(hyps)
            for i, s in zip(live, seg, strict=False):
                segments[i] = s
            # Empty segments never reach the jar; scaling by the live fraction makes each of them
            # count as a 0 in the corpus value instead of silently shrinking the corpus.
            return MeteorResult(corpus * len(live) / len(hyps), segments, "java-meteor-1.5")
    corpus, segments = python_meteor(hyps, refs)
    return MeteorResult(corpus, segments, "python-exact", note)
