#!/usr/bin/env bash
# Gives the Docker engine gVisor's runtime, `runsc`, for the code executor's runsc mode
# (code_exec_runtime=runsc, docs/sandbox.md "The code executor") and its tests: installs Debian's
# runsc package where /usr/bin/runsc is missing, registers it in /etc/docker/daemon.json (merged
# into what is there: every other key is kept), and makes dockerd reload its runtimes (SIGHUP:
# running containers are not touched).
#
# runtimeArgs ["--network=none"]: gVisor's own network stack refuses to start in the engine's
# network namespace ("cannot run with network enabled in root network namespace"), even for a
# container started with --network=none; the executor's containers have no network anyway. The
# platform stays gVisor's default (ptrace in Debian's 20221219 build): it needs no /dev/kvm, and
# --platform=kvm hangs at full CPU inside a virtual machine.
#
# It is tried before anyone can use it: registered first under a name of its own
# (ftbus-runsc-probe), one container run the way the executor runs them (no network, read-only
# root, non-root, no capabilities, memory and pids limits), and only then registered as `runsc`.
# Where it does not run, `runsc` is not registered (the gVisor tests are then skipped, saying the
# engine has no runsc) and this says why. A runsc already registered that runs is left as it is.
#
# Usage: deploy/sandbox/runsc.sh [IMAGE]   (default: $FTBUS_SANDBOX_IMAGE or ftbus-sandbox:latest)
#   exit 0: the engine has a runsc runtime that runs IMAGE
#   exit 3: it cannot be had here; the message says why
# Idempotent: a second run checks the registration, runs one container (about half a second) and
# changes nothing.
set -uo pipefail

log() { printf '[runsc] %s\n' "$*" >&2; }
IMAGE="${1:-${FTBUS_SANDBOX_IMAGE:-ftbus-sandbox:latest}}"
CONFIG=/etc/docker/daemon.json
RUNSC=/usr/bin/runsc
ARGS='["--network=none"]'
PROBE=ftbus-runsc-probe
why=""

# The engine's entry for runtime $1, as JSON ("null" when it has none).
entry() {
    timeout 20 docker info --format '{{json .Runtimes}}' 2>/dev/null \
        | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin).get(sys.argv[1])))' "$1" 2>/dev/null
}
OURS="$(python3 -c 'import json, sys; print(json.dumps({"path": sys.argv[1], "runtimeArgs": json.loads(sys.argv[2])}))' "$RUNSC" "$ARGS")"

# One container under runtime $1, as the executor starts one. Bounded: a sandbox that never starts
# (a platform that hangs) is killed by its container id, and its container removed.
probe() {
    local runtime="$1" id out rc
    if ! id="$(timeout 30 docker create --runtime="$runtime" --network=none --read-only --user 1000 \
            --cap-drop=ALL --security-opt=no-new-privileges --memory=256m --pids-limit=1024 \
            --label ftbus.runsc-probe=1 "$IMAGE" python3 -c 'print(6 * 7)' 2>&1)"; then
        why="docker create failed: $(printf '%s' "$id" | tail -n 1)"; return 1
    fi
    out="$(timeout 60 docker start -a "$id" 2>&1)"; rc=$?
    if [ "$rc" = 124 ]; then
        # Only this container's runtime processes carry its id on their command line.
        for pid in $(pgrep -f -- "$id"); do kill -9 "$pid" 2>/dev/null; done
        out="no answer within 60 s"
    fi
    timeout 30 docker rm -f "$id" >/dev/null 2>&1
    if [ "$out" != 42 ]; then
        why="a container under runsc did not run: $(printf '%s' "$out" | grep -v '^$' | tail -n 1)"
        return 1
    fi
}

# Sets runtimes[$1] to ours (set) or removes it (unset) in daemon.json, every other key kept;
# "unset" removes only an entry equal to ours. Prints "changed" when it wrote the file; refuses a
# file that is not a JSON object. An empty "runtimes" stays: without the key, dockerd's SIGHUP
# keeps the runtimes it had.
edit() {
    python3 - "$CONFIG" "$1" "$2" "$OURS" <<'EOF'
import json, os, sys
path, action, name, ours = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
try:
    with open(path) as f:
        text = f.read()
except FileNotFoundError:
    text = ""
try:
    config = json.loads(text) if text.strip() else {}
except ValueError as exc:
    sys.exit(f"[runsc] {path} is not JSON ({exc}): not touched")
if not isinstance(config, dict) or not isinstance(config.get("runtimes", {}), dict):
    sys.exit(f"[runsc] {path} is not a JSON object with a runtimes object: not touched")
runtimes = config.setdefault("runtimes", {})
if action == "set":
    if runtimes.get(name) == ours:
        sys.exit(0)
    runtimes[name] = ours
else:
    if runtimes.get(name) != ours:
        sys.exit(0)
    del runtimes[name]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".ftbus-tmp", "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(path + ".ftbus-tmp", path)
print("changed")
EOF
}

# SIGHUP: dockerd reads daemon.json again; wait until the engine's entry for $1 is $2 (JSON).
reload() {
    local name="$1" want="$2" pid
    pid="$(pgrep -xo dockerd)" || { log "no dockerd process to reload"; return 1; }
    kill -HUP "$pid" || return 1
    for _ in $(seq 1 120); do  # 30 s and more: an engine just rid of a hung sandbox is slow to answer
        [ "$(entry "$name")" = "$want" ] && return 0
        sleep 0.25
    done
    log "dockerd did not take $CONFIG's runtimes on SIGHUP (see its log)"
    return 1
}

# Registers ours as runtime $1 (set) or takes it out (unset), and reloads when that changed the file.
register() {
    local action="$1" name="$2" changed want
    changed="$(edit "$action" "$name")" || return 1
    if [ "$action" = set ]; then want="$OURS"; else want=null; fi
    if [ -n "$changed" ] || [ "$(entry "$name")" != "$want" ]; then
        reload "$name" "$want" || return 1
    fi
}

if ! timeout 20 docker info >/dev/null 2>&1; then
    log "no Docker engine answers (deploy/sandbox/engine.sh starts one)"; exit 3
fi
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "no image $IMAGE to try runsc with (deploy/sandbox/build.sh builds it)"; exit 3
fi

existing="$(entry runsc)"
if [ "$existing" != null ] && probe runsc; then
    exit 0  # registered already (a second run, or by hand), and it runs
fi
if [ "$existing" != null ] && [ "$existing" != "$OURS" ]; then
    log "the engine's runsc runtime ($existing) does not run: ${why} (left as it is)"; exit 3
fi

if [ "$(id -u)" != 0 ]; then
    log "registering runsc needs root (apt-get install runsc, writing $CONFIG, SIGHUP to dockerd)"; exit 3
fi
if [ ! -x "$RUNSC" ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "no $RUNSC and no apt-get to install it (Debian's package is runsc)"; exit 3
    fi
    log "installing Debian's runsc (gVisor; about 5 s)"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null 2>&1 \
           || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc; } >/dev/null 2>&1; }; then
        log "apt-get install runsc failed (no such package in this mirror?)"; exit 3
    fi
fi

# Tried under a name nobody uses first: a broken runsc is never what the executor gets.
register set "$PROBE" || exit 3
probe "$PROBE"; ok=$?
register unset "$PROBE"
if [ "$ok" != 0 ]; then
    register unset runsc  # an entry of ours from an earlier run that no longer runs
    log "runsc does not run on this machine: ${why}"; exit 3
fi
register set runsc || exit 3
log "registered runsc in $CONFIG (runtimeArgs $ARGS): docker run --runtime=runsc works"
