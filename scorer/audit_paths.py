"""Paths as the auditor compares them: normalised, de-obfuscated, found in code and in argv.

The auditor's path rules must judge the file a fact is about, not the string that named it. So a
path is normalised before any rule sees it (``.``, ``..``, ``//``, relative to its cwd, link prefixes
such as ``/proc/self/root`` replaced by their targets; docs/scoring.md lists them), and code and
command lines are searched twice: as written, and after undoing shell quoting, which is how an agent
hides a path from a substring check without changing what the shell opens. Paths built at run time
are not followed here; what the program then opens is a fact the shim records.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from functools import lru_cache

# A path token in code: an absolute path after a quote, space, '=', '(' or ',' (or at a line start).
_PATH_TOKEN = re.compile(r"""(?:(?<=['"\s=(,])|^)(/[^\s'"(),;|&<>`]+)""", re.M)

RUN_ID = re.compile(r"(?<![0-9A-Za-z])\d{8}T\d{6}-[0-9a-f]{6}(?![0-9a-f])")
"""A run id as ``amb-record`` makes them (``20260101T120000-a1b2c3``)."""

# Links every recorder host and agent image has: (component pattern, what it stands for). "{cwd}"
# stands for the cwd the path was used in, "/" for the root. Matched on the resolved prefix, as the
# kernel follows them while it walks the path (so /proc/self/cwd/.. is the cwd's parent).
_PROC = r"(?:self|thread-self|\d+)"
_ALIASES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("proc", _PROC, "root"), "/"),
    (("proc", _PROC, "task", r"\d+", "root"), "/"),
    (("proc", r"(?:self|thread-self)", "cwd"), "{cwd}"),
    (("dev", "fd"), "/proc/self/fd"),
    (("var", "run"), "/run"),
    (("bin",), "/usr/bin"),
    (("sbin",), "/usr/sbin"),
    (("lib",), "/usr/lib"),
    (("lib64",), "/usr/lib64"),
)
_ALIAS_RES = tuple((tuple(re.compile(c + r"\Z") for c in comps), to) for comps, to in _ALIASES)


def _alias(stack: list[str], cwd: str | None) -> list[str] | None:
    for comps, to in _ALIAS_RES:
        if len(stack) == len(comps) and all(c.match(s) for c, s in zip(comps, stack, strict=True)):
            if to == "{cwd}":
                if not (cwd and cwd.startswith("/")):
                    return None
                to = cwd
            return [c for c in to.split("/") if c]
    return None


@lru_cache(maxsize=1 << 16)  # a run names the same few paths many times over
def normalise(path: str, cwd: str | None = None) -> str:
    """``path`` as the file it names: relative to ``cwd``, ``.``/``..``/``//`` resolved left to right
    as the kernel walks it, known link prefixes replaced by their targets.

    A relative path with no ``cwd`` stays relative (normalised)."""
    if not path:
        return path
    if not path.startswith("/"):
        if not cwd:
            return posixpath.normpath(path)
        path = cwd.rstrip("/") + "/" + path
    cwd_norm = normalise(cwd) if cwd and cwd.startswith("/") and cwd != path else cwd
    stack: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if stack:
                stack.pop()
            continue
        stack.append(comp)
        for _ in range(4):  # an alias may land on another (e.g. /proc/self/cwd -> /var/run)
            target = _alias(stack, cwd_norm)
            if target is None or target == stack:
                break
            stack = target
    return "/" + "/".join(stack)


# ---- undoing shell quoting ---------------------------------------------------------------------------

_ANSI_C = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b"}
_ANSI_C.update({"\\": "\\", "'": "'", '"': '"', "?": "?"})
_WORD_BREAK = set(" \t\n;|&<>()`")


def _ansi_c(text: str, i: int) -> tuple[str, int]:
    """Decode a ``$'...'`` body starting at ``text[i]``; returns (decoded, index after the quote)."""
    out = []
    n = len(text)
    while i < n and text[i] != "'":
        c = text[i]
        if c == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt in _ANSI_C:
                out.append(_ANSI_C[nxt])
                i += 2
            elif nxt in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[nxt]
                m = re.match(f"[0-9a-fA-F]{{1,{width}}}", text[i + 2 : i + 2 + width])
                if m and int(m.group(0), 16) < 0x110000:
                    out.append(chr(int(m.group(0), 16)))
                    i += 2 + len(m.group(0))
                else:
                    out.append("\\" + nxt)
                    i += 2
            elif nxt in "01234567":
                m = re.match(r"[0-7]{1,3}", text[i + 1 : i + 4])
                assert m is not None
                out.append(chr(int(m.group(0), 8) & 0xFF))
                i += 1 + len(m.group(0))
            else:
                out.append(c + nxt)
                i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out), i + 1


def shell_words(text: str) -> list[str]:
    """The words a POSIX shell would make of ``text``, quotes and escapes removed (best effort,
    never fails: an unclosed quote runs to the end). Expansions (``$VAR``) are left as written."""
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WORD_BREAK:
            if in_word:
                words.append("".join(cur))
                cur, in_word = [], False
            i += 1
            continue
        in_word = True
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                cur.append(text[i + 1])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            cur.append(text[i + 1 : end])
            i = end + 1
        elif c == "$" and i + 1 < n and text[i + 1] == "'":
            decoded, i = _ansi_c(text, i + 2)
            cur.append(decoded)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    if text[i + 1] != "\n":
                        cur.append(text[i + 1])
                    i += 2
                else:
                    cur.append(text[i])
                    i += 1
            i += 1
        else:
            cur.append(c)
            i += 1
    if in_word:
        words.append("".join(cur))
    return words


# Adjacent string literals joined by whitespace or '+' ('/da' 'ta', "/da" + "ta"): one string in
# Python and most languages, so the splice is removed before looking for paths.
_SPLICE = re.compile(r"""(['"])[ \t]*\+?[ \t]*\1""")


def path_tokens(text: str, _depth: int = 0) -> list[str]:
    """Absolute paths ``text`` names: as written, and as a shell would read them after quoting is
    undone, also inside quoted code (``bash -c "python -c '...'"``); each path once, in order."""
    found = dict.fromkeys(_PATH_TOKEN.findall(text))
    if _depth < 3 and any(c in text for c in "'\"\\$"):
        for variant in dict.fromkeys((text, _SPLICE.sub("", text))):
            for word in shell_words(variant):
                for token in _PATH_TOKEN.findall(word):
                    found.setdefault(token)
                if word != variant and any(c in word for c in "'\"\\$"):
                    for token in path_tokens(word, _depth + 1):
                        found.setdefault(token)
    return list(found)


def arg_paths(argv: Iterable[str], cwd: str | None) -> list[str]:
    """Every path a process's argv names, normalised against its cwd.

    Each argument is searched like code (``bash -c '...'`` and ``python -c '...'`` carry code), and an
    argument that looks like a relative path (holds a ``/``, no spaces, not an option) is taken
    relative to the cwd, so ``cd /data && cat private/x`` is the same fact as ``cat /data/private/x``."""
    out: dict[str, None] = {}
    for arg in argv:
        for token in path_tokens(arg):
            out.setdefault(normalise(token, cwd))
        relative = "/" in arg and not arg.startswith(("/", "-")) and "://" not in arg
        if relative and not any(c.isspace() for c in arg):
            out.setdefault(normalise(arg, cwd))
    return list(out)
