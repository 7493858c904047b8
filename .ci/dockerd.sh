#!/usr/bin/env bash
# Make a Docker engine answer on this machine, for the container tests.
#
# Installs docker.io (and iptables, debootstrap) with apt-get when missing, starts dockerd in the background
# when none answers (its log goes to $AMB_DOCKERD_LOG, default /tmp/amb-dockerd.log), and waits
# until `docker info` answers. Safe to call again: an engine that already answers is left alone.
# Needs root (CI runs as root); prints one line saying what it did.
set -euo pipefail

log="${AMB_DOCKERD_LOG:-/tmp/amb-dockerd.log}"
wait_s="${AMB_DOCKERD_WAIT:-120}"

answers() {
    # The python SDK is what the project uses; the CLI is only a convenience and may be missing.
    if command -v docker >/dev/null 2>&1; then
        docker info >/dev/null 2>&1
    else
        [ -S /var/run/docker.sock ] && curl -fsS --unix-socket /var/run/docker.sock http://d/_ping >/dev/null 2>&1
    fi
}


missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)         # docker's networks, amb's host firewall
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)   # `amb images build --base-from-rootfs`
if [ ${#missing[@]} -gt 0 ]; then
    echo "dockerd.sh: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! answers && ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "dockerd.sh: starting dockerd (log: $log)" >&2
    nohup dockerd >"$log" 2>&1 &
fi

for _ in $(seq "$wait_s"); do
    if answers; then
        echo "dockerd.sh: docker engine answers"
        exit 0
    fi
    sleep 1
done
echo "dockerd.sh: dockerd did not answer within ${wait_s}s; last lines of $log:" >&2
tail -n 20 "$log" >&2 || true
exit 1
