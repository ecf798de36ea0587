#!/usr/bin/env bash
# Builds the sandbox image (default tag ftbus-sandbox:latest) that the docker runner starts for every
# piece of candidate-controlled work: process_data.py, llamafactory-cli, lm_eval.
#
# Offline by construction: no image registry is reached. The root filesystem is Debian's own
# (debootstrap, minbase, from the mirror this host's apt already uses) with python3 and socat
# (the in-container end of the LLM gateway, docs/sandbox.md); the fine-tuning toolchain is the
# project's own (.toolchain, built from PyPI by deploy/toolchain/install.sh), copied to
# /opt/toolchain with its scripts pointed at the image's interpreter. The result is imported with
# `docker import`. Nothing of the services (no ftbus code, no settings, no credentials) is inside.
#
# Usage: deploy/sandbox/build.sh [TOOLCHAIN_DIR] [TAG]
# Idempotent: the image carries a label with the hash of its recipe (this script, the toolchain's
# stamp); a second run with the same recipe returns at once. SANDBOX_FORCE=1 rebuilds.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TOOLCHAIN="$(cd "${1:-$REPO/.toolchain}" && pwd)"
TAG="${2:-${FTBUS_SANDBOX_IMAGE:-ftbus-sandbox:latest}}"
SUITE="${SANDBOX_SUITE:-bookworm}"
SANDBOX_UID=1000

log() { printf '[sandbox] %s\n' "$*" >&2; }

stamp="$TOOLCHAIN/.ftbus-toolchain.stamp"
if [ ! -f "$stamp" ]; then
    log "no toolchain at $TOOLCHAIN (missing $stamp): run 'make toolchain' first"; exit 2
fi
key="$( { cat "${BASH_SOURCE[0]}" "$stamp"; echo "$SUITE"; } | sha256sum | cut -c1-16)"

if [ "${SANDBOX_FORCE:-0}" != 1 ] \
    && [ "$(docker image inspect -f '{{ index .Config.Labels "ftbus.recipe" }}' "$TAG" 2>/dev/null)" = "$key" ]; then
    log "up to date: $TAG (recipe $key)"
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    else
        log "debootstrap is missing: apt-get install debootstrap (as root), then run this again"; exit 2
    fi
fi

# The mirror this host's apt uses (deb822 or one-line sources): images come from the same place.
mirror="${SANDBOX_MIRROR:-}"
if [ -z "$mirror" ]; then
    mirror="$(grep -hs -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | head -n1)"
fi
if [ -z "$mirror" ]; then
    mirror="$(grep -hs -E '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -n1)"
fi
if [ -z "$mirror" ]; then
    log "cannot tell which Debian mirror apt uses here; set SANDBOX_MIRROR"; exit 2
fi

start=$(date +%s)
work="$(mktemp -d "${TMPDIR:-/tmp}/ftbus-sandbox.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

log "debootstrap $SUITE (minbase + python3, socat) from the host's mirror"
debootstrap --variant=minbase --include=python3,socat "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; log "debootstrap failed"; exit 1; }

py_version="$(chroot "$root" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
host_version="$("$TOOLCHAIN/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$py_version" != "$host_version" ]; then
    log "the image's Python is $py_version but the toolchain was built for $host_version: their compiled"
    log "packages would not load. Build the toolchain with TOOLCHAIN_PYTHON=python$py_version"; exit 2
fi

log "copying the toolchain ($(du -sh "$TOOLCHAIN" | cut -f1)) to /opt/toolchain"
dest="$root/opt/toolchain"
mkdir -p "$dest/bin" "$dest/lib"
cp -a "$TOOLCHAIN/lib/python$py_version" "$dest/lib/"
find "$dest/lib" -name '__pycache__' -prune -exec rm -rf {} +
# The bytecode, compiled here once, by the toolchain's interpreter (the image's Python version, checked
# above): in the image the toolchain is read-only to the sandbox user and PYTHONDONTWRITEBYTECODE is
# set, so without it every run (a training, a benchmark engine, a data script) compiled torch,
# transformers and llamafactory from source again: about 4 s of CPU a process. The paths in the
# bytecode are the image's (-s/-p); the sources keep their times (cp -a, tar), so it stays valid.
log "compiling the toolchain's bytecode"
if ! "$TOOLCHAIN/bin/python" -m compileall -q -j 0 -s "$root" -p / "$dest/lib/python$py_version" \
        >"$work/compileall.log" 2>&1; then
    # A few files are for another Python version (torch's py312_intrinsics.py): never imported here.
    log "files for another Python version, left uncompiled: $(grep -c '^\*\*\* Error compiling' "$work/compileall.log")"
    grep '^\*\*\* Error compiling' "$work/compileall.log" | head -n 5 >&2
fi
ln -s "/usr/bin/python$py_version" "$dest/bin/python"
ln -s python "$dest/bin/python3"
ln -s python "$dest/bin/python$py_version"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$py_version" > "$dest/pyvenv.cfg"
# Console scripts (llamafactory-cli, lm_eval, ...): same code, the image's interpreter.
host_shebang="#!$TOOLCHAIN/bin/python"
for script in "$TOOLCHAIN"/bin/*; do
    name="$(basename "$script")"
    [ -f "$script" ] && [ ! -L "$script" ] || continue
    case "$name" in activate*|Activate*) continue ;; esac
    if head -c 2 "$script" | grep -q '#!'; then
        first="$(head -n1 "$script")"
        case "$first" in
            "$host_shebang"*) { echo "#!/opt/toolchain/bin/python"; tail -n +2 "$script"; } > "$dest/bin/$name"
                              chmod 755 "$dest/bin/$name" ;;
        esac
    fi
done

# A non-root user for candidate code; /root traversable, because the runner mounts each host path
# at the same path inside (a worker's home may be /root); nothing of the host lives there.
echo "ftbus:x:$SANDBOX_UID:$SANDBOX_UID:ftbus sandbox:/tmp:/usr/sbin/nologin" >> "$root/etc/passwd"
echo "ftbus:x:$SANDBOX_UID:" >> "$root/etc/group"
chmod 755 "$root/root"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/usr/share/doc" "$root/usr/share/man"

log "checking the toolchain inside the root filesystem"
chroot "$root" /opt/toolchain/bin/python -c 'import torch, transformers, llamafactory, lm_eval, peft; print("torch", torch.__version__)' >&2

log "importing as $TAG"
tar -C "$root" -c . | docker import \
    --change "LABEL ftbus.recipe=$key" \
    --change "ENV PATH=/opt/toolchain/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV HOME=/tmp LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1" \
    --change "USER $SANDBOX_UID" \
    --change "WORKDIR /tmp" \
    - "$TAG" >/dev/null
log "built $TAG in $(( $(date +%s) - start )) s ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
