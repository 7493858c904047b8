"""Install packages into a virtual environment with uv, honouring this machine's pip configuration.

    python scripts/uv_install.py [--python PYTHON] PIP-INSTALL-ARGUMENTS...

pip resolves and fetches one package at a time: the dev environment took ~240 s to install here,
uv ~25 s, with the same versions of every package. So that both see the same packages, the index,
extra indexes, find-links, constraints, certificate bundle and timeout of pip's configuration
(`pip config list`: its files and PIP_* variables) are handed to uv; a file:// location that does
not exist is dropped, as pip ignores it. uv comes from the running interpreter's environment, and
is installed there with pip when missing. If uv cannot be had or fails, pip does the install, so
the slower path is the only cost of anything uv does not understand.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

PIP_OPTIONS_FOR_UV = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_config() -> dict[str, str]:
    """pip's effective settings (environment variables over files), as ``name -> value``."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    settings: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        section, _, name = key.rpartition(".")
        (from_env if section == ":env:" else settings)[name] = value.strip().strip("'\"")
    return settings | from_env


def _present(location: str) -> bool:
    """False for a local index or wheel folder that does not exist (pip warns and goes on)."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path)).exists()
    if "://" not in location:
        return Path(location).exists()
    return True


def uv_arguments(config: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's command-line options and environment for the same packages as pip's configuration."""
    args: list[str] = []
    env: dict[str, str] = {}
    extra_indexes = False
    for name, flag in PIP_OPTIONS_FOR_UV.items():
        for location in shlex.split(config.get(name, "")):
            if _present(location):
                args += [flag, location]
                extra_indexes |= name == "extra-index-url"
    if extra_indexes:
        args += ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best version of any index
    if config.get("cert") and not os.environ.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = config["cert"]
    if config.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = config["default-timeout"]
    return args, env


def _uv() -> Path | None:
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "uv"]
        if subprocess.run(pip, check=False).returncode != 0:
            return None
    return uv if uv.exists() else None


def main(argv: list[str]) -> int:
    python = sys.executable
    if argv[:1] == ["--python"] and len(argv) > 1:
        python, argv = argv[1], argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    uv = _uv()
    if uv is not None:
        args, env = uv_arguments(pip_config())
        # --compile-bytecode: pip writes each module's bytecode at install, uv by default leaves it
        # to the first import, which never writes it where PYTHONDONTWRITEBYTECODE is set: there
        # every process would compile every module it imports (a third of amb-record's start-up).
        command = [str(uv), "pip", "install", "-q", "--compile-bytecode", "--python", python, *args, *argv]
        if subprocess.run(command, env=os.environ | env, check=False).returncode == 0:
            return 0
        print("uv_install: uv failed (above); installing with pip instead", file=sys.stderr)
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *argv]
    return subprocess.run(pip, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
