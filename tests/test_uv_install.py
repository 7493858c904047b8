"""scripts/uv_install.py hands pip's configuration to uv, so both install the same packages."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("uv_install", ROOT / "scripts" / "uv_install.py")
assert SPEC and SPEC.loader
uv_install = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(uv_install)


def test_pip_settings_become_uv_options_and_missing_local_locations_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2\n")
    config = {
        "index-url": "https://index.example/simple",
        "extra-index-url": f"file://{tmp_path}/absent/simple file://{wheels}",
        "find-links": f"{wheels} {tmp_path / 'gone'}",
        "constraint": str(constraints),
        "cert": "/some/bundle.pem",
        "default-timeout": "180",
    }
    args, env = uv_install.uv_arguments(config)
    assert args == [
        "--index-url",
        "https://index.example/simple",
        "--extra-index-url",
        f"file://{wheels}",
        "--find-links",
        str(wheels),
        "--constraint",
        str(constraints),
        "--index-strategy",
        "unsafe-best-match",
    ]
    assert env == {"UV_HTTP_TIMEOUT": "180", "SSL_CERT_FILE": "/some/bundle.pem"}
    monkeypatch.setenv("SSL_CERT_FILE", "/chosen/by/the/user.pem")
    assert "SSL_CERT_FILE" not in uv_install.uv_arguments(config)[1]  # what the user set stands


def test_no_pip_configuration_means_no_uv_options() -> None:
    assert uv_install.uv_arguments({}) == ([], {})


def test_pip_config_is_read_from_files_and_environment_with_the_environment_winning(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /from/file\ndefault-timeout = 60\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": str(conf), "PIP_DEFAULT_TIMEOUT": "7"}
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import uv_install; "
        "import json; print(json.dumps(uv_install.pip_config()))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    settings = json.loads(out.stdout)
    assert settings["find-links"] == "/from/file"
    assert settings["default-timeout"] == "7"


def test_the_installed_packages_carry_their_bytecode() -> None:
    # uv leaves bytecode to the first import unless asked, and no import writes it where
    # PYTHONDONTWRITEBYTECODE is set: every process would compile every package it imports.
    import click
    import duckdb
    import mitmproxy.master

    for module in (click, duckdb, mitmproxy.master):
        assert module.__file__ is not None
        cached = Path(importlib.util.cache_from_source(module.__file__))
        assert cached.is_file(), f"{module.__name__}: no bytecode at {cached}"
