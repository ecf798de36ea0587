#!/usr/bin/env bash
# Builds the Debian base image (default tag ftbus-base:bookworm) that the services and toolchain
# images are built FROM when no image registry is reachable: Debian's own root filesystem
# (debootstrap, minbase, from the mirror this host's apt already uses) with python3, python3-venv
# and the CA certificates, imported with `docker import`. The same approach as the sandbox image
# (deploy/sandbox/build.sh), whose base is the same suite and mirror.
#
# Usage: deploy/images/base.sh [TAG]
# Idempotent: the image carries a label with the hash of its recipe; a second run returns at once.
# IMAGES_FORCE=1 rebuilds.
set -euo pipefail

TAG="${1:-ftbus-base:bookworm}"
SUITE="${SANDBOX_SUITE:-bookworm}"
PACKAGES="python3,python3-venv,ca-certificates"

log() { printf '[base] %s\n' "$*" >&2; }

key="$( { cat "${BASH_SOURCE[0]}"; echo "$SUITE $PACKAGES"; } | sha256sum | cut -c1-16)"
if [ "${IMAGES_FORCE:-0}" != 1 ] \
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

# The mirror this host's apt uses (deb822 or one-line sources).
mirror="${SANDBOX_MIRROR:-}"
[ -n "$mirror" ] || mirror="$(grep -hs -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | head -n1)"
[ -n "$mirror" ] || mirror="$(grep -hs -E '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -n1)"
if [ -z "$mirror" ]; then
    log "cannot tell which Debian mirror apt uses here; set SANDBOX_MIRROR"; exit 2
fi

start=$(date +%s)
work="$(mktemp -d "${TMPDIR:-/tmp}/ftbus-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

log "debootstrap $SUITE (minbase + $PACKAGES) from the host's mirror"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; log "debootstrap failed"; exit 1; }
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/usr/share/doc" "$root/usr/share/man"

log "importing as $TAG"
tar -C "$root" -c . | docker import \
    --change "LABEL ftbus.recipe=$key" \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8" \
    --change 'CMD ["python3"]' \
    - "$TAG" >/dev/null
log "built $TAG in $(( $(date +%s) - start )) s ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
