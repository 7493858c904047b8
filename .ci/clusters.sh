#!/usr/bin/env bash
# The engines the scale-out tests run real clusters of (tests/clusters/): SLURM's daemons and client
# from Debian (with munge for its authentication) and busybox-static for the tiny test image; unshare,
# nsenter and ip for the Ray cluster's loopback-only network namespace.
# Nothing is started here and nothing under /etc is configured: each test session brings up its own
# throwaway cluster (own munge key and socket, own ports, loopback only) and takes it down again.
# Safe to run again: packages already present are not fetched. Needs root (CI runs as root).
set -euo pipefail

missing=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge busybox:busybox-static \
    unshare:util-linux nsenter:util-linux ip:iproute2; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "clusters.sh: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # Without --no-install-recommends slurmd pulls in ~40 more packages, none of them needed here.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "clusters.sh: slurm $(dpkg-query -W -f '${Version}' slurmd) and munge $(dpkg-query -W -f '${Version}' munge) ready"
