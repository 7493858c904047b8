"""bench/shim: the shim's wall-time overhead on a process-heavy workload, inside one container.

In one agent container (the real image, the docker backend's limits and flags), N short
``python3 -c pass`` runs are timed without the shim and N under it (the docker backend's tracer
unless ``--tracer`` says otherwise, events streamed to a real receiver), in blocks interleaved ABBA
so that load from elsewhere falls on both sides alike. Each block's loop times itself, so the
shim's start-up is not in the wall figures. What the figures mean: docs/containers.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from amb.images import ensure_images
from bench import figures
from recorder.docker_backend import CAPS, SHIM_ENTRY
from recorder.shim.receiver import ShimReceiver
from recorder.spool import spool_path
from schemas.codec import decode_event
from schemas.events import Note, ProcessExited
from schemas.frames import scan

LOOP = r"""
cpu() {  # CPU time (ns) used so far by everything in this container: cgroup v1, else v2
    if [ -r /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then cat /sys/fs/cgroup/cpuacct/cpuacct.usage
    elif [ -r /sys/fs/cgroup/cpu.stat ]; then
        echo $(( $(awk '/^usage_usec/ {print $2}' /sys/fs/cgroup/cpu.stat) * 1000 ))
    else echo 0; fi
}
c0=$(cpu); s=$(date +%s%N)
for i in $(seq "$2"); do python3 -c pass; done
e=$(date +%s%N); c1=$(cpu)
echo "$1 $((e-s)) $((c1-c0))"
"""


def as_agent(label: str, runs: int) -> str:
    """The loop of ``runs`` runs as the agent's user, without the shim."""
    return f'setpriv --reuid=1000 --regid=1000 --clear-groups bash -c "$AMB_LOOP" _ {label} {runs}'


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000, help="python -c runs per measurement")
    p.add_argument("--rounds", type=int, default=5, help="ABBA rounds (each: plain, shim, shim, plain)")
    p.add_argument(
        "--tracer",
        default="auto",
        choices=("auto", "seccomp-notify", "strace", "proc-poll"),
        help="the shim's process tracer (auto: what the docker backend gets)",
    )
    figures.add_argument(p, "shim")
    args = p.parse_args()
    figs = figures.Figures(p, args)
    block = max(1, args.n // (2 * args.rounds))

    import docker

    image = ensure_images(("agent",), log=lambda m: print(m, file=sys.stderr))["agent"].tag
    client = docker.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="amb-bench-shim-"))
    store = tmp / "store"
    steps: list[str] = []
    receivers: list[tuple[str, ShimReceiver]] = []
    volumes: dict[str, dict[str, str]] = {}
    for _r in range(args.rounds):
        for label in ("plain", "shim", "shim", "plain"):
            if label == "plain":
                steps.append(as_agent("plain", block))
                continue
            k = len(receivers)
            sock = tmp / f"sock{k}"
            sock.mkdir(mode=0o700)
            receivers.append((f"bench-{k}", ShimReceiver(store, f"bench-{k}", sock).start()))
            volumes[str(sock)] = {"bind": f"/run/amb/sock{k}", "mode": "ro"}
            steps.append(
                f'/opt/venv/bin/python -I -c "{SHIM_ENTRY}" run --socket /run/amb/sock{k}/shim.sock '
                f"--workspace /workspace --agent-uid 1000 --tracer {args.tracer} -- bash -c "
                f'"$AMB_LOOP" _ shim {block}'
            )
    # A discarded warm-up first: the first python runs in a fresh container pay for cold caches.
    steps.insert(0, as_agent("warmup", max(20, block // 2)))
    script = " && ".join(steps)
    print(
        f"image {image}: {args.rounds} ABBA round(s), blocks of {block} `python3 -c pass` runs",
        file=sys.stderr,
    )
    container = client.containers.run(
        image,
        ["bash", "-c", script],
        detach=True,
        init=True,
        volumes=volumes,
        network_mode="none",
        security_opt=["no-new-privileges"],
        cap_drop=["ALL"],
        cap_add=CAPS,
        read_only=True,
        tmpfs={
            "/tmp": "size=1g,mode=1777",
            "/workspace": "size=1g,mode=1777",
            "/home/agent": "size=64m,mode=1777",
        },
        nano_cpus=int(2e9),
        mem_limit="8g",
        pids_limit=4096,
        user="0:0",
        environment={"AMB_LOOP": LOOP},
    )
    status = container.wait()["StatusCode"]
    logs = container.logs().decode()
    container.remove(force=True)
    if status != 0:
        print(logs, file=sys.stderr)
        raise SystemExit(f"bench container failed with exit {status}")
    times: dict[str, list[float]] = {"plain": [], "shim": []}
    cpus: dict[str, list[float]] = {"plain": [], "shim": []}
    for line in logs.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in times and parts[1].isdigit():
            times[parts[0]].append(int(parts[1]) / 1e9)
            cpus[parts[0]].append(int(parts[2]) / 1e9)
    recorded, cpu = [], []
    for run_id, receiver in receivers:
        receiver.close()
        path = spool_path(store, run_id, "shim")
        payloads = [decode_event(bytes(b)).payload for b in scan(path.read_bytes()).bodies]
        recorded.append(
            sum(isinstance(p, ProcessExited) and p.argv == ["python3", "-c", "pass"] for p in payloads)
        )
        bye = next(p.data for p in payloads if isinstance(p, Note) and p.text == "shim finished")
        cpu.append(bye["cpu_ms_shim"] + bye.get("cpu_ms_strace", 0))
    ratio = sum(times["shim"]) / sum(times["plain"])
    cpu_plain, cpu_shim = sum(cpus["plain"]), sum(cpus["shim"])
    all_recorded = all(n == block for n in recorded)
    cpu_ratio = f" (container CPU {cpu_shim / cpu_plain:.3f}×)" if cpu_plain > 0 else ""
    env = "AMB_BASE_FROM_ROOTFS=1 " if os.environ.get("AMB_BASE_FROM_ROOTFS") == "1" else ""
    figs.add(
        "strace" if args.tracer == "strace" else "overhead",
        f"{2 * block * args.rounds:,} `python -c` runs in a container under the shim"
        + (" (`--tracer strace`)" if args.tracer == "strace" else "")
        + " ([how](docs/containers.md#what-the-shim-records-and-how))",
        f"**{ratio:.3f}×** wall{cpu_ratio}; {sum(recorded):,} of {block * len(recorded):,} recorded; "
        f"{sum(cpu) / max(1, sum(recorded)):.2f} ms of shim CPU each",
        "the same runs without the shim, in ABBA blocks",
        f"≤ 1.05× ({figures.met(ratio <= 1.05)}); every process recorded ({figures.met(all_recorded)})",
        command=env + figs.command,
    )
    figs.write()
    return 0 if all_recorded else 1


if __name__ == "__main__":
    raise SystemExit(main())
