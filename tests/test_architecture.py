"""Tripwires: the layers' import rules (docs/architecture.md, which must agree with ``ALLOWED``),
stored-event hygiene, the size of modules and functions, and a test file for every module of 150
lines or more."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ["schemas", "recorder", "replay", "scorer", "tasks", "agents", "images", "sweeps", "amb"]

ALLOWED = {
    "schemas": set(),
    "recorder": {"schemas"},
    "replay": {"schemas"},
    "tasks": {"schemas"},
    "scorer": {"schemas", "replay", "tasks"},
    "agents": {"schemas", "tasks"},
    "images": set(),
    # Sweeps compose the recorder (one run per shard), the store (ingest of shards), the tasks and
    # the offline baseline; nothing below imports them.
    "sweeps": {"schemas", "recorder", "replay", "tasks", "agents"},
    "amb": set(PACKAGES) - {"amb"},
}
THIRD_PARTY_IN_SCHEMAS = {"msgspec", "zstandard", "numpy"}
"""zstandard: the blob store's codec (schemas/blobcodec.py) is part of its contract; every reader
decodes the same records. numpy: the blob index (schemas/packindex.py) holds 8 bytes a blob and
sorts them in place, which no standard-library container can do without a copy of Python ints."""


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def sources(package: str):
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_dependency_direction(package):
    for path in sources(package):
        bad = (imports(path) & set(PACKAGES)) - ALLOWED[package] - {package}
        assert not bad, (
            f"{path.relative_to(ROOT)} imports {sorted(bad)}; {package} may import only "
            f"{sorted(ALLOWED[package])}"
        )


def test_schemas_is_pure():
    import sys

    stdlib = set(sys.stdlib_module_names)
    for path in sources("schemas"):
        extra = imports(path) - stdlib - THIRD_PARTY_IN_SCHEMAS - {"schemas"}
        assert not extra, (
            f"{path.relative_to(ROOT)} imports {sorted(extra)}: schemas is msgspec, zstandard + stdlib only"
        )


OMITS_DEFAULTS = {"schemas/atif.py"}
"""A foreign format's model, never stored: ATIF writers leave out the fields a step does not have."""


def test_no_omit_defaults_on_events():
    for path in sources("schemas"):
        if path.relative_to(ROOT).as_posix() in OMITS_DEFAULTS:
            continue
        text = path.read_text(encoding="utf-8")
        assert "omit_defaults=True" not in text, f"{path}: stored events must keep every field"


def test_architecture_doc_states_these_rules():
    """docs/architecture.md's rules table is ``ALLOWED``, row for row."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- rules: begin[^\n]*-->\n(.*?)<!-- rules: end -->", doc, re.S)
    assert block, (
        "docs/architecture.md has no rules block (<!-- rules: begin ... --> ... <!-- rules: end -->)"
    )
    stated = {}
    for package, allowed in re.findall(r"^\| `(\w+)` \| (.+?) \|$", block.group(1), re.M):
        names = set(re.findall(r"`(\w+)`", allowed))
        stated[package] = set(PACKAGES) - {package} if allowed == "every other package" else names
    assert stated == ALLOWED, (
        "docs/architecture.md's rules table differs from ALLOWED: update the one that is wrong"
    )


# --- rooms of a livable size ------------------------------------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
SIZED = [*PACKAGES, "scripts"]
"""Every source folder but bench/ and tests/: benches are scripts read top to bottom and tests are
lists of cases, so neither is held to the limits."""


def test_modules_and_functions_stay_small():
    """No source module over ``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES``
    (from its ``def`` to its last line), measured with ``ast`` on every Python file of ``SIZED``."""
    too_big = []
    for path in sorted(p for folder in SIZED for p in (ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT)
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_big.append(f"{rel}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(
                        f"{rel}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})"
                    )
    assert not too_big, "split these into smaller pieces:\n" + "\n".join(too_big)


# --- a test file for every module of MIN_LINES lines or more ----------------------------------------

MIN_LINES = 150

COVERED_BY: dict[str, tuple[tuple[str, ...], str]] = {
    # module: (the test files that cover it, why they and not a file named after it)
    "scorer/judge/cache.py": (
        ("tests/scorer/test_rescore.py", "tests/scorer/test_judge_llm.py"),
        "the judge's cache is what makes a rescore ask nothing: tested through rescoring with an LLM judge",
    ),
    "replay/blob_reads.py": (
        ("tests/replay/test_blob_pass.py",),
        "the pass's bookkeeping and its pieces are tested through the pass that keeps and cuts them",
    ),
    "schemas/blobverify.py": (
        ("tests/schemas/test_packstore.py", "tests/schemas/test_blob_delta.py"),
        "the many-blob check is the blob store's verify path, tested with the packs it checks",
    ),
    "schemas/atif.py": (
        (
            "tests/replay/test_export_atif.py",
            "tests/recorder/importers/test_foreign_values.py",
            "tests/schemas/providers/test_contract.py",
        ),
        "the one ATIF model is tested as the export writes it and the import reads it back or refuses it",
    ),
    "schemas/providers/__init__.py": (
        ("tests/schemas/providers/test_contract.py", "tests/schemas/providers/test_parsers.py"),
        "the provider registry is what the contract suite runs every provider through",
    ),
    "schemas/providers/anthropic_messages.py": (
        ("tests/schemas/providers/test_contract.py", "tests/schemas/providers/test_parsers.py"),
        "one contract suite for every provider, and one file for the parsers' edge cases",
    ),
    "schemas/providers/conversation.py": (
        ("tests/schemas/providers/test_contract.py",),
        "a conversation is built and read back by every provider in the contract suite",
    ),
    "schemas/providers/gemini.py": (
        ("tests/schemas/providers/test_contract.py", "tests/schemas/providers/test_parsers.py"),
        "one contract suite for every provider, and one file for the parsers' edge cases",
    ),
    "schemas/providers/openai_chat.py": (
        ("tests/schemas/providers/test_contract.py", "tests/schemas/providers/test_parsers.py"),
        "one contract suite for every provider, and one file for the parsers' edge cases",
    ),
    "schemas/providers/openai_responses.py": (
        ("tests/schemas/providers/test_contract.py", "tests/schemas/providers/test_parsers.py"),
        "one contract suite for every provider, and one file for the parsers' edge cases",
    ),
    "schemas/providers/result.py": (
        ("tests/schemas/providers/test_contract.py", "tests/recorder/test_proxy_failures.py"),
        "a call's result is tested per provider and as the events a failed proxied call records",
    ),
    "recorder/shim/kernel.py": (
        ("tests/recorder/test_shim_notify.py", "tests/recorder/test_shim_seccomp.py"),
        "the kernel calls are the notify tracer's; they are tested through it",
    ),
    "scorer/scanners.py": (
        ("tests/scorer/test_scan.py", "tests/amb/test_scan_cmds.py"),
        "scanners are loaded and identified as a scan runs them: tested by the scans they make",
    ),
    "replay/shard_check.py": (
        ("tests/sweeps/test_shards.py",),
        "a shard's checks are tested as the shards a sweep loads",
    ),
    "agents/baseline/context.py": (
        ("tests/agents/test_policy.py",),
        "the policy's context is tested as the decisions the policy makes",
    ),
    "agents/baseline/steps.py": (
        ("tests/agents/test_policy.py",),
        "the policy's steps are tested as the decisions the policy makes",
    ),
    "schemas/blobcodec.py": (
        ("tests/schemas/test_blob_delta.py", "tests/schemas/test_packstore.py"),
        "the codecs are read and written through the blob store: delta records, pack records, hostile frames",
    ),
    "schemas/tempdirs.py": (
        ("tests/recorder/test_gc_entries.py", "tests/recorder/test_docker_gc.py"),
        "temp entries are named and owned here so that `amb gc` can find them: tested by what gc removes",
    ),
    "recorder/backend.py": (
        ("tests/recorder/test_backend_contract.py",),
        "the Backend protocol: the contract suite runs every backend through it",
    ),
    "recorder/gc.py": (
        ("tests/recorder/test_gc_entries.py", "tests/recorder/test_docker_gc.py"),
        "`amb gc` against every kind of leftover, with live and dead owners",
    ),
    "recorder/importers/atif.py": (
        ("tests/replay/test_export_atif.py", "tests/recorder/importers/test_run_ids.py"),
        "ATIF import is tested as the round trip with the export, and by the importers' shared id rules",
    ),
    "recorder/importers/automedbench_calls.py": (
        ("tests/recorder/importers/test_automedbench.py", "tests/hostile/test_hostile_imports.py"),
        "the model calls of an AutoMedBench import, tested with every branch's run folder",
    ),
    "recorder/importers/inspect_eval.py": (
        ("tests/recorder/importers/test_inspect.py", "tests/recorder/importers/test_import_names.py"),
        "named after the format (Inspect logs), not the module",
    ),
    "recorder/importers/values.py": (
        ("tests/recorder/importers/test_foreign_values.py", "tests/hostile/test_hostile_imports.py"),
        "the checks of foreign values, through every importer",
    ),
    "recorder/isolation.py": (
        ("tests/recorder/test_local_isolation.py", "tests/isolation/test_isolation.py"),
        "the agent's namespaces, tested on a real local run",
    ),
    "recorder/local_backend.py": (
        ("tests/recorder/test_backend_contract.py", "tests/recorder/test_run_local.py"),
        "the contract suite and the local runs",
    ),
    "recorder/proxy/addon.py": (
        (
            "tests/recorder/test_proxy_failures.py",
            "tests/recorder/test_proxy_calls.py",
            "tests/amb/test_record_providers.py",
        ),
        "the addon is the proxy's hooks: tested through a real proxy with real SDK clients",
    ),
    "recorder/proxy/server.py": (
        ("tests/recorder/test_proxy_failures.py", "tests/recorder/test_proxy_websocket.py"),
        "the mitmproxy master, started by tests/fakes/harness.py for every proxy test",
    ),
    "recorder/proxy/sink.py": (
        ("tests/recorder/test_proxy_ledger.py", "tests/recorder/test_proxy_blobwriter.py"),
        "the sink writes what the ledger and the blob writer decide: tested with them",
    ),
    "recorder/proxy/upstreams.py": (
        ("tests/recorder/test_proxy_gemini.py", "tests/recorder/test_proxy_gemini_elsewhere.py"),
        "upstream routing, tested with every provider's path prefixes",
    ),
    "recorder/run.py": (
        ("tests/recorder/test_run_local.py", "tests/recorder/test_docker_backend.py"),
        "the orchestration of a run, tested as whole runs on each backend",
    ),
    "recorder/shim/shim.py": (
        ("tests/recorder/test_shim.py", "tests/recorder/test_docker_backend.py"),
        "the shim's main loop, tested in a container",
    ),
    "recorder/synthetic.py": (
        ("tests/replay/test_ingest.py", "tests/amb/test_store_cmds.py"),
        "synthetic runs are the input of the store's tests; `amb generate` is tested as a command",
    ),
    "replay/blob_gc.py": (
        ("tests/replay/test_blob_maintenance.py",),
        "one test file for the blob store's maintenance: gc and migration",
    ),
    "replay/export/otel.py": (
        ("tests/replay/test_export_parquet_otel.py",),
        "one test file for the OpenTelemetry and Parquet exports",
    ),
    "replay/export/parquet.py": (
        ("tests/replay/test_export_parquet_otel.py",),
        "one test file for the OpenTelemetry and Parquet exports",
    ),
    "replay/ingest_frames.py": (
        ("tests/replay/test_ingest_fast_paths.py", "tests/replay/test_ingest.py"),
        "the Python part of ingest's checks and its frames files, tested through ingest's fast paths",
    ),
    "replay/manifest.py": (
        ("tests/replay/test_verify.py", "tests/replay/test_ingest_fast_paths.py"),
        "manifests are made by ingest and checked by verify",
    ),
    "replay/migrations.py": (
        ("tests/replay/test_hot_columns.py", "tests/replay/test_payload_zstd.py", "tests/amb/test_about.py"),
        "each migration is tested with what it adds; the level with `amb --version`",
    ),
    "replay/replayer/recorded.py": (
        ("tests/replay/test_replayer.py",),
        "the replay endpoint's tests: matching, serving, hostile recordings",
    ),
    "replay/replayer/server.py": (
        ("tests/replay/test_replayer.py",),
        "the replay endpoint's tests: matching, serving, hostile recordings",
    ),
    "replay/shards.py": (
        ("tests/sweeps/test_shards.py", "tests/sweeps/test_shard_ingest_crash.py"),
        "shards are a sweep's; their tests are with the sweeps",
    ),
    "replay/spools.py": (
        ("tests/replay/test_spools_after_ingest.py",),
        "named after what it does with spools",
    ),
    "replay/stats.py": (
        ("tests/amb/test_store_stats.py",),
        "`amb store stats`, tested as the command",
    ),
    "replay/store.py": (
        ("tests/replay/test_sql.py", "tests/replay/test_ingest.py"),
        "opening the store is in every store test; its read-only SQL in test_sql",
    ),
    "replay/views.py": (
        ("tests/replay/test_hot_columns.py", "tests/replay/test_sql.py"),
        "the views, tested through SQL and against their JSON definitions",
    ),
    "replay/web/calls.py": (
        ("tests/replay/test_viewer_api.py",),
        "the viewer's JSON API, through its server",
    ),
    "replay/web/events.py": (
        ("tests/replay/test_viewer_api.py", "tests/replay/test_payload_search.py"),
        "the viewer's JSON API, through its server; the payload search against lowering",
    ),
    "replay/web/files.py": (
        ("tests/replay/test_viewer_api.py", "tests/replay/test_viewer_preview.py"),
        "the viewer's JSON API, through its server; the array previews",
    ),
    "replay/web/routes.py": (
        ("tests/replay/test_viewer_api.py",),
        "the viewer's JSON API, through its server",
    ),
    "replay/web/runs.py": (
        ("tests/replay/test_viewer_api.py", "tests/replay/test_summary.py"),
        "the viewer's JSON API, through its server; its run index held to the runs' summaries",
    ),
    "replay/web/db.py": (
        ("tests/replay/test_sql.py", "tests/replay/test_viewer_api.py"),
        "the viewer's connection: its sandbox and its bounded scan with amb sql's, used by the API",
    ),
    "replay/web/diff.py": (
        ("tests/replay/test_viewer_diff.py",),
        "the viewer's diff of two runs",
    ),
    "replay/web/server.py": (
        ("tests/replay/test_viewer_pages.py", "tests/replay/test_viewer_api.py"),
        "the viewer's HTTP server, tested through its pages and API",
    ),
    "scorer/audit_paths.py": (
        ("tests/scorer/test_audit_facts.py", "tests/scorer/test_audit.py"),
        "the audit's path rules, tested with the audit",
    ),
    "scorer/batch.py": (
        ("tests/scorer/test_rescore.py", "tests/scorer/test_pipeline.py"),
        "scoring many runs: the rescoring tests",
    ),
    "scorer/evidence.py": (
        ("tests/scorer/test_judge_llm.py", "tests/scorer/test_audit.py"),
        "the evidence view is what judges read: tested with them",
    ),
    "scorer/judge/offline.py": (
        ("tests/scorer/test_stages.py", "tests/scorer/test_audit.py"),
        "the offline judge's verdicts are the stage scores",
    ),
    "scorer/ledger.py": (
        ("tests/scorer/test_rescore.py", "tests/scorer/test_judge_stability.py"),
        "the append-only score tables, tested by rescoring",
    ),
    "scorer/metrics/detection.py": (
        ("tests/scorer/test_metric_detection.py",),
        "tests/scorer/test_metric_<name>.py",
    ),
    "scorer/metrics/lpips.py": (("tests/scorer/test_metric_lpips.py",), "tests/scorer/test_metric_<name>.py"),
    "scorer/metrics/meteor.py": (
        ("tests/scorer/test_metric_text.py",),
        "one test file for the report score's parts",
    ),
    "scorer/metrics/radgraph_proxy.py": (
        ("tests/scorer/test_metric_text.py",),
        "one test file for the report score's parts",
    ),
    "scorer/metrics/text.py": (("tests/scorer/test_metric_text.py",), "tests/scorer/test_metric_<name>.py"),
    "scorer/metrics/vqa.py": (("tests/scorer/test_metric_vqa.py",), "tests/scorer/test_metric_<name>.py"),
    "scorer/profile_diff.py": (
        ("tests/amb/test_diff_profiles.py",),
        "`amb report --diff-profiles`, as the command",
    ),
    "scorer/report.py": (
        ("tests/scorer/test_report_html.py", "tests/scorer/test_report_links.py"),
        "the report, tested as the HTML it writes",
    ),
    "scorer/row.py": (
        ("tests/scorer/test_pipeline.py", "tests/scorer/test_medal.py"),
        "a score row, built by the pipeline",
    ),
    "scorer/taskgrade.py": (("tests/scorer/test_taskgrade_names.py",), "named after what it checks"),
    "scorer/trajectory.py": (
        ("tests/scorer/test_stages.py", "tests/scorer/test_signals.py"),
        "the trajectory fold is the input of stages and signals",
    ),
    "tasks/synth/medimg.py": (
        ("tests/tasks/test_synth_report.py", "tests/tasks/test_synth_vqa.py"),
        "the image writer of the report and VQA twins",
    ),
    "agents/baseline/kit.py": (
        ("tests/agents/test_kit.py", "tests/agents/test_shippable.py"),
        "tests/agents/ is flat",
    ),
    "agents/baseline/kit_lib.py": (("tests/agents/test_kit.py",), "the kit's library, tested with the kit"),
    "agents/baseline/policy.py": (("tests/agents/test_policy.py",), "tests/agents/ is flat"),
    "agents/baseline/server.py": (("tests/agents/test_server.py",), "tests/agents/ is flat"),
    "sweeps/driver.py": (
        ("tests/sweeps/test_sweep_local.py", "tests/clusters/test_slurm.py"),
        "the driver, tested as whole sweeps",
    ),
    "sweeps/exec.py": (
        ("tests/sweeps/test_sweep_local.py", "tests/sweeps/test_spec.py"),
        "`amb sweep exec`, tested by the sweeps that run it",
    ),
    "sweeps/executor.py": (
        ("tests/clusters/test_executor_errors.py", "tests/sweeps/test_sweep_local.py"),
        "the executor protocol, tested through every executor",
    ),
    "sweeps/local.py": (("tests/sweeps/test_sweep_local.py",), "the local executor's sweeps"),
    "sweeps/plan.py": (
        ("tests/sweeps/test_sweep_local.py", "tests/sweeps/test_sweep_budget.py"),
        "the sweep file, tested by the sweeps it plans",
    ),
    "sweeps/ray.py": (("tests/clusters/test_ray.py",), "tested on a real Ray cluster (tests/clusters/)"),
    "sweeps/shard.py": (
        ("tests/sweeps/test_shards.py", "tests/sweeps/test_shard_ingest_crash.py"),
        "one test file for shards",
    ),
    "sweeps/slurm.py": (
        ("tests/clusters/test_slurm.py",),
        "tested on a real SLURM cluster (tests/clusters/)",
    ),
    "amb/images.py": (
        ("tests/recorder/test_docker_images.py",),
        "the images, tested where the docker backend is",
    ),
    "amb/imports.py": (
        ("tests/recorder/importers/test_run_ids.py", "tests/recorder/importers/test_automedbench.py"),
        "the engine under `amb import`, tested through the command",
    ),
    "amb/interop_cmds.py": (
        ("tests/recorder/importers/test_automedbench.py", "tests/replay/test_export_atif.py"),
        "`amb import` and `amb export`, tested with each format",
    ),
    "amb/live_cmds.py": (("tests/amb/test_watch_checkout.py",), "named after its commands"),
    "amb/record.py": (("tests/amb/test_record_cli.py",), "named after the command (`amb-record`)"),
    "amb/sweep_cmds.py": (
        ("tests/sweeps/test_sweep_local.py", "tests/clusters/test_slurm.py"),
        "`amb sweep`, tested with the sweeps",
    ),
}
"""Modules whose tests are not in a file named after them; every one must still be tested."""


def named_tests(module: Path) -> list[Path]:
    """The test files named after ``module``: ``tests/<its package path>/test_<name>.py``, or, in
    its top package's test folder, ``test_<sub-package>_<name>.py`` (``tests/recorder/test_proxy_gate.py``
    for ``recorder/proxy/gate.py``)."""
    parts = module.relative_to(ROOT).with_suffix("").parts
    found = [ROOT / "tests" / Path(*parts[:-1]) / f"test_{parts[-1]}.py"]
    if len(parts) > 2:
        found.append(ROOT / "tests" / parts[0] / ("test_" + "_".join(parts[1:]) + ".py"))
    return found


def test_every_big_module_has_a_test_file():
    missing, redundant = [], []
    for package in PACKAGES:
        for path in sources(package):
            if len(path.read_text(encoding="utf-8").splitlines()) < MIN_LINES:
                continue
            rel = str(path.relative_to(ROOT))
            named = any(t.is_file() for t in named_tests(path))
            if not named and rel not in COVERED_BY:
                missing.append(rel)
            elif named and rel in COVERED_BY:
                redundant.append(rel)
    assert not missing, (
        f"modules of {MIN_LINES}+ lines with no test file named after them and no COVERED_BY entry: {missing}"
    )
    assert not redundant, (
        f"modules with a test file named after them: drop their COVERED_BY entry: {redundant}"
    )


def test_covered_by_names_what_exists():
    stale = []
    for module, (tests, why) in COVERED_BY.items():
        if not (ROOT / module).is_file():
            stale.append(f"{module}: no such module (moved or split? update its entry)")
        stale += [f"{module}: {t} does not exist" for t in tests if not (ROOT / t).is_file()]
        if not tests or not why.strip():
            stale.append(f"{module}: name the test files and say why")
    assert not stale, "\n".join(stale)
