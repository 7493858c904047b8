"""``amb doctor``: what the next commands need, checked in a second or two, each with what to do.

Every check is a row: ``ok``; ``warn`` (amb can do it itself, e.g. build an image, or only some
commands need it); ``fail`` (the user must act before the commands that need it can work); ``skip``
(cannot be checked because something it depends on failed, or not asked for). The exit code is 1
when any check fails. Nothing is changed: images are looked up, not built; the store is probed
with a temporary file, not created.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from amb.common import nearest_existing
from schemas.errors import AmbError

MIN_DOCKER = (20, 10)
"""The oldest engine the docker backend was tested on (seccomp user notification, internal networks)."""

MIN_FREE_BYTES = 2 * 1024**3
"""Below this, a sweep's twins, workspaces and blobs can run out of room in the store's file system."""

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

JUDGE_VARIABLES = ("AMB_JUDGE_BASE_URL", "AMB_JUDGE_API_KEY", "AMB_JUDGE_MODEL")

DOCKER_TIMEOUT_S = 3


@dataclass
class Check:
    name: str
    status: str  # ok, warn, fail or skip
    detail: str
    fix: str | None = None


def _permission_denied(error: BaseException) -> bool:
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, PermissionError) or "Permission denied" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_docker() -> tuple[list[Check], Any]:
    """The engine and the permission to use it; returns the client when both are fine."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        import docker

        client = docker.from_env(timeout=DOCKER_TIMEOUT_S)
        client.ping()
        info = client.version()
    except Exception as e:
        if _permission_denied(e):
            return [
                Check(
                    "docker engine", "skip", f"an engine may run at {host}, but this user may not talk to it"
                ),
                Check(
                    "docker permission",
                    "fail",
                    f"permission denied on {host}",
                    "add this user to the docker group (`sudo usermod -aG docker $USER`, then log in "
                    "again), or run amb as a user who may use the engine",
                ),
            ], None
        reason = str(e).splitlines()[0][:160] if str(e) else e.__class__.__name__
        return [
            Check(
                "docker engine",
                "fail",
                f"no Docker engine answers at {host} ({reason})",
                "start one (`sudo systemctl start docker`, or `bash .ci/dockerd.sh` in a checkout) or point "
                "DOCKER_HOST at a running engine; without one, `amb demo` records local processes",
            ),
            Check("docker permission", "skip", "no engine to ask"),
        ], None
    version = str(info.get("Version", "?"))
    parts = tuple(int(p) for p in version.split("+")[0].split("-")[0].split(".")[:2] if p.isdigit())
    engine = Check(
        "docker engine", "ok", f"Docker {version} (API {info.get('ApiVersion', '?')}) answers at {host}"
    )
    if len(parts) == 2 and parts < MIN_DOCKER:
        engine = Check(
            "docker engine",
            "warn",
            f"Docker {version} answers at {host}, older than the "
            f"{MIN_DOCKER[0]}.{MIN_DOCKER[1]} amb is tested on",
            "upgrade the engine if container runs fail",
        )
    return [engine, Check("docker permission", "ok", "this user may use the engine")], client


def _debootstrap_ready() -> tuple[bool, str]:
    if shutil.which("debootstrap") is None:
        return False, "debootstrap is not on PATH"
    if os.geteuid() != 0:
        return False, "debootstrap needs root"
    if shutil.which("tar") is None:
        return False, "tar is not on PATH"
    return True, f"debootstrap at {shutil.which('debootstrap')}, running as root"


def check_base(client) -> tuple[list[Check], str | None]:
    """Where the images' base comes from (a registry's Python image, or a debootstrapped Debian), and
    the base image the next ``amb images build`` / ``amb demo`` would use (None when there is none yet)."""
    from amb.images import DEFAULT_BASE, find_image, rootfs_tag

    ready, why = _debootstrap_ready()
    want_rootfs = os.environ.get("AMB_BASE_FROM_ROOTFS", "") not in ("", "0")
    public = os.environ.get("AMB_BASE_IMAGE") or DEFAULT_BASE
    rootfs = rootfs_tag()
    tools = Check(
        "debootstrap",
        "ok" if ready else "warn",
        why if ready else f"{why}: `amb images build --base-from-rootfs` cannot make a base",
        None if ready else "apt-get install debootstrap (as root); needed only where no registry answers",
    )
    if client is None:
        return [Check("base image", "skip", "no engine to ask"), tools], None
    for ref in [rootfs, public] if want_rootfs else [public, rootfs]:
        if find_image(client, ref) is not None:
            how = "a debootstrapped Debian" if ref == rootfs else "a registry's image"
            return [Check("base image", "ok", f"{ref} is here ({how}); no download needed"), tools], ref
    if not want_rootfs and _registry_answers(client, public):
        base = Check("base image", "ok", f"a registry answers for {public}; `amb images build` pulls it")
    elif ready:
        source = "AMB_BASE_FROM_ROOTFS is set" if want_rootfs else "no registry"
        base = Check(
            "base image",
            "ok",
            f"no base image yet ({source}): "
            f"`amb images build --base-from-rootfs` debootstraps {rootfs} (a minute)",
        )
    else:
        tools.status = "fail"
        base = Check(
            "base image",
            "fail",
            f"no base image here, no registry answers for {public}, and {why}",
            "install debootstrap and run as root (then `amb images build --base-from-rootfs`), or "
            "make a registry reachable (or `docker load` a Python 3.11 Debian image and set "
            "AMB_BASE_IMAGE)",
        )
    return [base, tools], None


def _registry_answers(client, ref: str) -> bool:
    try:
        client.api.inspect_distribution(ref)
        return True
    except Exception:
        return False


def check_images(client, base: str | None) -> list[Check]:
    from amb.images import ROLES, content_hash, find_image

    if client is None:
        return [Check(f"{role} image", "skip", "no engine to ask") for role in ROLES]
    if base is None:
        return [
            Check(
                f"{role} image",
                "warn",
                "not built yet (there is no base image)",
                "`amb images build` (or `amb images build --base-from-rootfs` where no registry answers)",
            )
            for role in ROLES
        ]
    base_id = client.images.get(base).id
    flag = " --base-from-rootfs" if base.startswith("amb-base:rootfs-") else ""
    checks = []
    for role in ROLES:
        tag = f"amb-{role}:c-{content_hash(role, base_id)}"
        current = find_image(client, tag)
        latest = find_image(client, f"amb-{role}:latest") if current is not None else None
        if current is None:
            check = Check(
                f"{role} image",
                "warn",
                f"no {tag}: this amb's {role} image is not built on {base} (an older one may exist)",
                f"`amb images build{flag}` (a few minutes; `amb demo` builds the agent image itself)",
            )
        elif latest is None or latest.id != current.id:
            check = Check(
                f"{role} image",
                "warn",
                f"{tag} is current, but amb-{role}:latest is another build (another amb version or checkout)",
                f"`amb images build{flag}` points amb-{role}:latest at it (nothing is rebuilt)",
            )
        else:
            check = Check(f"{role} image", "ok", f"{tag} is current (content tag; amb-{role}:latest)")
        checks.append(check)
    return checks


def check_ca_bundle() -> Check:
    from amb.images import build_ca_bundle

    bundle = build_ca_bundle()
    fix = "install ca-certificates, or set AMB_BUILD_CA to the PEM bundle this machine trusts"
    if bundle is None:
        return Check(
            "CA bundle", "fail", "no CA bundle found: package installs in image builds cannot verify TLS", fix
        )
    try:
        n = bundle.read_bytes().count(b"-----BEGIN CERTIFICATE-----")
    except OSError as e:
        return Check("CA bundle", "fail", f"{bundle} cannot be read ({e.strerror})", fix)
    if n == 0:
        return Check("CA bundle", "fail", f"{bundle} holds no certificate", fix)
    return Check("CA bundle", "ok", f"{bundle} ({n} certificates), handed to image builds")


def check_store(store: Path) -> Check:
    """Can amb create files in the store (or create the store), and is there room?"""
    fix = f"give a writable --store (or AMB_STORE); {store} cannot be used"
    try:
        return _check_store(store, fix)
    except OSError as e:  # a parent this user may not search, a vanished mount, ...
        return Check("store", "fail", f"cannot reach {store}: {e.strerror or e}", fix)


def _check_store(store: Path, fix: str) -> Check:
    if store.exists() and not store.is_dir():
        return Check("store", "fail", f"{store} exists and is not a directory", fix)
    probe_dir = nearest_existing(store)
    if not probe_dir.is_dir():
        return Check("store", "fail", f"{probe_dir} (on the way to {store}) is not a directory", fix)
    try:
        fd, name = tempfile.mkstemp(prefix=".amb-doctor-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        where = "" if probe_dir == store else f" ({store} does not exist yet; its parent {probe_dir} is"
        detail = f"cannot write in {probe_dir}{where}{')' if where else ''}: {e.strerror or e}"
        return Check("store", "fail", detail, fix)
    free = shutil.disk_usage(probe_dir).free
    gib = free / 1024**3
    exists = "exists" if store.exists() else "will be created"
    if free < MIN_FREE_BYTES:
        return Check(
            "store",
            "warn",
            f"{store} {exists} and is writable, but only {gib:.1f} GiB are free",
            f"free some space (sweeps need ~{MIN_FREE_BYTES // 1024**3} GiB), or use another --store",
        )
    return Check("store", "ok", f"{store} {exists}, writable, {gib:.1f} GiB free")


def check_database(store: Path) -> Check:
    """Does the store's database open (when there is one)? A damaged file fails every command."""
    from replay.store import DB_NAME, Store, damage

    db = store / DB_NAME
    try:
        if not db.exists():
            return Check("database", "skip", f"no {db} yet (the first `amb ingest` or amb-record makes it)")
    except OSError as e:  # the store check says why
        return Check("database", "skip", f"cannot reach {db}: {e.strerror or e}")
    try:
        with Store.open(store, read_only=True, lock_timeout_s=2.0) as st:
            (runs,) = st.con.execute("SELECT count(DISTINCT run_id) FROM events").fetchall()[0]
    except Exception as e:  # damaged at its opening (an AmbError), or a block the query met
        cause = e.__cause__ if isinstance(e, AmbError) else e
        found = damage(cause, db) if cause is not None else None
        if found is None and isinstance(e, AmbError):  # busy (a writer holds it), unreadable
            return Check("database", "warn", f"{db} cannot be opened now: {e}", "run amb doctor again")
        if found is None:
            raise
        detail, _, fix = str(found).partition(": move it aside and ")
        return Check("database", "fail", detail, "move it aside and " + fix)
    return Check("database", "ok", f"{db} opens and holds {runs} runs")


def check_chromium() -> Check:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path is None:
            continue
        try:
            proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5)
            version = (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired, IndexError):
            version = ""
        if version:
            return Check("chromium", "ok", f"{version} at {path} (for checking the HTML report)")
        return Check("chromium", "warn", f"{path} does not answer --version", "reinstall Chromium")
    return Check(
        "chromium",
        "warn",
        f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}): the HTML report cannot be checked",
        "apt-get install chromium (in a checkout: `bash .ci/chromium.sh`); only the report check needs it",
    )


def check_isolation() -> Check:
    """Whether a local agent can be hidden the rest of the machine's processes (``recorder.isolation``)."""
    from recorder.isolation import probe

    why = probe()
    if why is None:
        return Check(
            "process isolation",
            "ok",
            "user, PID and mount namespaces work here: a local agent sees only its own processes",
        )
    if "not on PATH" in why:
        fix = "install util-linux (`apt-get install util-linux`), which has `unshare`"
    else:
        fix = (
            "allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; "
            "kernel.unprivileged_userns_clone = 1 where it exists; "
            "kernel.apparmor_restrict_unprivileged_userns = 0 under AppArmor), or use --backend docker"
        )
    return Check(
        "process isolation",
        "warn",
        f"a local agent would see every process of its user ({why}); amb-record says so at each run",
        fix,
    )


def check_judge(judge: str) -> Check:
    if judge != "llm":
        return Check(
            "judge endpoint",
            "skip",
            "the offline judge needs no endpoint (`amb doctor --judge llm` checks the LLM judge's variables)",
        )
    missing = [v for v in JUDGE_VARIABLES if not os.environ.get(v)]
    if missing:
        return Check(
            "judge endpoint",
            "fail",
            f"--judge llm needs {', '.join(missing)} (unset)",
            "export AMB_JUDGE_BASE_URL (an OpenAI-compatible endpoint), AMB_JUDGE_API_KEY and "
            "AMB_JUDGE_MODEL",
        )
    from urllib.parse import urlsplit

    url = os.environ["AMB_JUDGE_BASE_URL"]
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        return Check(
            "judge endpoint",
            "fail",
            f"AMB_JUDGE_BASE_URL={url!r} is not an http(s) URL",
            "give scheme://host[:port]/v1",
        )
    return Check("judge endpoint", "ok", f"{os.environ['AMB_JUDGE_MODEL']} at {url} (key set)")


def check_installation() -> Check:
    """The data files the commands read are in this installation (a partial install names them)."""
    from importlib.util import find_spec

    wanted = [("images", f"{r}/{n}") for r in ("agent", "grader") for n in ("Dockerfile", "requirements.txt")]
    wanted += [("images", "base/packages.txt"), ("amb", "demo-sweep.toml")]
    wanted += [("scorer", "profiles/paper-2026-06.toml"), ("schemas", "prices/openrouter-2026-05-28.toml")]
    wanted += [("tasks", "kidney-seg/spec.toml")]
    # The report grader's METEOR 1.5 jar comes with the pycocoevalcap dependency.
    wanted += [("pycocoevalcap", "meteor/meteor-1.5.jar")]

    def present(pkg: str, rel: str) -> bool:
        spec = find_spec(pkg)  # located, not imported (importing scorer or tasks is not free)
        places = list(spec.submodule_search_locations or []) if spec else []
        return bool(places) and Path(places[0], rel).is_file()

    missing = [f"{pkg}/{rel}" for pkg, rel in wanted if not present(pkg, rel)]
    from amb.about import package_version

    where = Path(__file__).resolve().parent.parent
    if missing:
        return Check(
            "installation",
            "fail",
            f"amb {package_version()} at {where} lacks {', '.join(missing)}",
            "reinstall amb-recorder (`pip install --force-reinstall amb-recorder`)",
        )
    return Check("installation", "ok", f"amb {package_version()} at {where}, its data files present")


def run_checks(store: Path, judge: str) -> list[Check]:
    # Chromium takes a few hundred milliseconds to print its version: ask it while docker answers.
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    chromium = pool.submit(check_chromium)
    checks = [check_installation()]
    docker_checks, client = check_docker()
    checks += docker_checks
    try:
        base_checks, base = check_base(client)
        checks += base_checks
        checks += check_images(client, base)
    except AmbError as e:  # a broken installation (already named above) or an engine gone mid-way
        checks += [Check(name, "fail", str(e)) for name in ("base image", "agent image", "grader image")]
    checks += [
        check_ca_bundle(),
        check_store(store),
        check_database(store),
        check_isolation(),
        chromium.result(),
        check_judge(judge),
    ]
    pool.shutdown()
    return checks


MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "-"}


@click.command("doctor")
@click.option(
    "--store",
    envvar="AMB_STORE",
    default="amb-store",
    show_default=True,
    help="The store the next commands will use (checked, not created). Env: AMB_STORE.",
)
@click.option(
    "--judge",
    type=click.Choice(["offline", "llm"]),
    default="offline",
    show_default=True,
    help="The judge you mean to score with (llm: check the endpoint variables).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(store: str, judge: str, as_json: bool) -> None:
    """Check what the next commands need (Docker, images, base, CA, store, isolation, Chromium, judge)."""
    t0 = time.monotonic()
    checks = run_checks(Path(store), judge)
    failed = [c for c in checks if c.status == "fail"]
    if as_json:
        seconds = round(time.monotonic() - t0, 2)
        shown = {"ok": not failed, "seconds": seconds, "checks": [asdict(c) for c in checks]}
        click.echo(json.dumps(shown, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            click.echo(f"{MARK[c.status]:4}  {c.name:{width}}  {c.detail}")
            if c.fix and c.status in ("warn", "fail"):
                click.echo(f"{'':4}  {'':{width}}  -> {c.fix}")
        verdict = (
            f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed" if failed else "nothing blocks"
        )
        click.echo(f"amb doctor: {verdict} ({time.monotonic() - t0:.1f} s)")
    if failed:
        sys.exit(1)


commands = [doctor]
