"""Agent-side tooling for end-to-end tests: a separate virtual environment with the newest openai
(3.x), anthropic and google-genai SDKs, and node's undici for fetch through a proxy.

Real agents live in their own environments; the project's venv keeps openai 2.x because
mitmproxy 11.0.2 pins h11<=0.14 while openai 3.x needs h11>=0.16. Both are created once, at
``<repo>/.venv-agents`` (ignored by git), and reused while they hold what is needed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-agents"
NODE_DIR = VENV / "node"
CHECK = (
    "import openai, anthropic, google.genai, sys; "
    "sys.exit(0 if int(openai.__version__.split('.')[0]) >= 3 else 1)"
)


def agents_python() -> Path:
    """The agents' interpreter (openai>=3, anthropic and google-genai installed), created if needed."""
    py = VENV / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", CHECK], capture_output=True).returncode == 0:
        return py
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "openai>=3", "anthropic", "google-genai"], check=True
    )
    subprocess.run([py, "-c", CHECK], check=True)
    return py


def undici_dir() -> Path:
    """A node_modules folder holding undici (for ProxyAgent: node's fetch ignores HTTP(S)_PROXY)."""
    if (NODE_DIR / "node_modules" / "undici" / "package.json").exists():
        return NODE_DIR
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install undici for the node fetch test")
    subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR), "undici@6"],
        check=True,
        capture_output=True,
    )
    return NODE_DIR


GEMINI_CLI = "@google/gemini-cli@0.61.0"
"""Google's Gemini CLI, pinned (its engines field asks for node >= 20, which the machine has); the
test runs it unchanged. npm keeps the package in its own cache, so a re-install is quick."""


def gemini_cli() -> Path:
    """The ``gemini`` executable, installed under .venv-agents/node on first use."""
    exe = NODE_DIR / "node_modules" / ".bin" / "gemini"
    package = NODE_DIR / "node_modules" / "@google" / "gemini-cli" / "package.json"
    if exe.exists() and package.exists():  # the version from its package file: node takes seconds to start
        if json.loads(package.read_text()).get("version") == GEMINI_CLI.rsplit("@", 1)[1]:
            return exe
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install the Gemini CLI for its test")
    subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR), GEMINI_CLI],
        check=True,
        capture_output=True,
    )
    return exe
