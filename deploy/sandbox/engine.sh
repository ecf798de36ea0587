#!/usr/bin/env bash
# Makes a Docker engine reachable for the sandbox runner: installs Debian's docker.io when the
# engine is missing, and starts dockerd in the background when nothing is listening (these machines
# have no init system to start it). Idempotent and quick when the engine already answers.
# Usage: deploy/sandbox/engine.sh            exit 0: the engine answers `docker info`
#                                            exit 3: it cannot be had here; the message says what to do
set -uo pipefail

log() { printf '[engine] %s\n' "$*" >&2; }
state="${FTBUS_HOME:-$HOME/.ftbus}"

if docker info >/dev/null 2>&1; then
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "no Docker engine here, and this user cannot install one (needs root and apt-get)."
        log "Install Docker (Debian: apt-get install docker.io), start dockerd, then run this again;"
        log "or run the services with FTBUS_SANDBOX=local (development only: candidate code is NOT isolated)."
        exit 3
    fi
    log "installing Debian's docker.io (about 20 s)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap; } >/dev/null 2>&1; then
        log "apt-get install docker.io failed: check the package mirror, or use FTBUS_SANDBOX=local (no isolation)"
        exit 3
    fi
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    # A pid file left by an engine that was killed (a CI machine is handed over with its processes
    # ended) makes dockerd refuse to start.
    rm -f /var/run/docker.pid
    mkdir -p "$state"
    log "starting dockerd (log: $state/dockerd.log)"
    # setsid + nohup: the engine must outlive the make process that started it.
    setsid nohup dockerd >"$state/dockerd.log" 2>&1 < /dev/null &
fi

for _ in $(seq 1 120); do
    if docker info >/dev/null 2>&1; then
        log "engine ready"
        exit 0
    fi
    sleep 0.5
done
log "dockerd did not answer within 60 s; see $state/dockerd.log (a kernel without overlayfs or cgroups cannot run it)."
log "Or run the services with FTBUS_SANDBOX=local (development only: candidate code is NOT isolated)."
exit 3
