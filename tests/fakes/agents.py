"""Agent-side tooling for end-to-end tests: a separate virtual environment with the newest openai
(3.x), anthropic and google-genai SDKs, and node's undici for fetch through a proxy.

Real agents live in their own environments; the project's venv keeps openai 2.x because
mitmproxy 11.0.2 pins h11<=0.14 while openai 3.x needs h11>=0.16. Both are created once, at
``<repo>/.venv-agents`` (ignored by git), and reused while they hold what is needed.

Making them takes minutes on a fresh clone, so the full test command starts ``python
tests/fakes/agents.py`` in the background while the lint runs (scripts/test.sh). Every maker holds
one lock file, so a test that needs a tool while the background job (or another test worker) is
making it waits for that job instead of racing it, and then finds the tool ready.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-agents"
UV_INSTALL = ROOT / "scripts" / "uv_install.py"
NODE_DIR = VENV / "node"
CHECK = (
    "import sys; from importlib.metadata import version; "
    "version('anthropic'); version('google-genai'); "
    "sys.exit(0 if int(version('openai').split('.')[0]) >= 3 else 1)"
)
"""Whether the environment holds the SDKs, read from their installed metadata: importing the three
(the newest anthropic SDK above all) took 13 s of every test session's first agent test under load."""


@contextlib.contextmanager
def _making() -> Iterator[None]:
    """Held while a tool is checked or made: one maker at a time across processes."""
    VENV.mkdir(exist_ok=True)
    with open(VENV / ".making.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def agents_python() -> Path:
    """The agents' interpreter (openai>=3, anthropic and google-genai installed), created if needed."""
    py = VENV / "bin" / "python"
    with _making():
        if py.exists() and subprocess.run([py, "-c", CHECK], capture_output=True).returncode == 0:
            return py
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        install = [sys.executable, str(UV_INSTALL), "--python", str(py)]
        subprocess.run([*install, "openai>=3", "anthropic", "google-genai"], check=True)
        subprocess.run([py, "-c", CHECK], check=True)
    return py


def _npm_install(package: str, purpose: str) -> None:
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"npm is needed to install {package} for {purpose}")
    subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR), package],
        check=True,
        capture_output=True,
    )


def undici_dir() -> Path:
    """A node_modules folder holding undici (for ProxyAgent: node's fetch ignores HTTP(S)_PROXY)."""
    with _making():
        if not (NODE_DIR / "node_modules" / "undici" / "package.json").exists():
            _npm_install("undici@6", "the node fetch test")
    return NODE_DIR


GEMINI_CLI = "@google/gemini-cli@0.61.0"
"""Google's Gemini CLI, pinned (its engines field asks for node >= 20, which the machine has); the
test runs it unchanged. npm keeps the package in its own cache, so a re-install is quick."""


def gemini_cli() -> Path:
    """The ``gemini`` executable, installed under .venv-agents/node on first use."""
    exe = NODE_DIR / "node_modules" / ".bin" / "gemini"
    package = NODE_DIR / "node_modules" / "@google" / "gemini-cli" / "package.json"
    with _making():
        # The version from its package file: node takes seconds to start.
        if not (
            exe.exists()
            and package.exists()
            and json.loads(package.read_text()).get("version") == GEMINI_CLI.rsplit("@", 1)[1]
        ):
            _npm_install(GEMINI_CLI, "its test")
    return exe


if __name__ == "__main__":
    # Make every tool ahead of the tests that need them (scripts/test.sh runs this in the background).
    agents_python()
    undici_dir()
    gemini_cli()
