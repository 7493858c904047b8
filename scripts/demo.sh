#!/usr/bin/env bash
# The main job (`./just demo`): record the offline baseline agent on one synthetic task per track,
# score the runs, print the leaderboard, write the HTML report; then list, verify and query the runs.
# No API key and no download: the "model" is a scripted policy served on loopback (amb baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
store="${AMB_STORE:-out/demo-store}"
export AMB_STORE="$store"
start=$(date +%s)
rm -rf "$store" out/demo
mkdir -p out

# The docker backend when a Docker engine answers (building the agent image on first use: from a
# public Python base, or, where no registry is reachable, from a Debian root filesystem), else local.
backend=local
why="no Docker engine answers"
build_agent() {
    echo "demo: building the agent image (first run only)" >&2
    amb images build --only agent >&2 && return 0
    if [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null 2>&1; then
        echo "demo: no registry reachable: building the base from a Debian root filesystem instead" >&2
        amb images build --only agent --base-from-rootfs >&2 && return 0
    fi
    return 1
}
if python -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; then
    why="a Docker engine answers, but the agent image could not be built (see above)"
    if python -c 'import docker; docker.from_env().images.get("amb-agent:latest")' >/dev/null 2>&1 || build_agent; then
        backend=docker
    fi
fi
if [ "$backend" = docker ]; then
    echo "demo: a Docker engine answers: each run is recorded in a container (docker backend, with the shim)" >&2
else
    echo "demo: $why: runs are recorded as local processes (local backend)" >&2
fi
sweep=out/demo-sweep.toml
sed -e "s/^backend = .*/backend = \"$backend\"/" -e 's#^work = .*#work = "demo"#' scripts/demo-sweep.toml > "$sweep"

echo "demo: recording 20 runs (2 agents x 5 tasks x 2 tiers), 2 at a time" >&2
amb sweep "$sweep" --html out/demo-report.html

echo
echo "== the same runs rescored under the public code's rules (code-2026-04): which options changed which numbers"
amb score --all --profile code-2026-04 --references out/demo/data > /dev/null
amb report --diff-profiles paper-2026-06 code-2026-04 | sed -n 1,60p

echo
echo "== the runs, their hash chains, and one SQL question over them"
amb runs
amb verify
amb sql "SELECT run_id, count(*) AS calls, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out FROM model_calls GROUP BY ALL ORDER BY run_id"
echo
echo "demo: report written to out/demo-report.html; store in $store; $(( $(date +%s) - start ))s in all"
