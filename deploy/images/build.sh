#!/usr/bin/env bash
# `make images`: the three images of a deployment, built with no image registry:
#
#   ftbus-base:bookworm      Debian by debootstrap (deploy/images/base.sh): what the others are FROM
#   ftbus-sandbox            candidate code (deploy/sandbox/build.sh: the same debootstrap approach,
#                            with this host's toolchain)
#   ftbus-services           the services, the CLI, the dashboard and nats-server (services.Dockerfile)
#   ftbus-toolchain          the services plus /opt/toolchain, taken from ftbus-sandbox
#
# each tagged `latest` and the version of pyproject.toml. Python packages come from a wheelhouse
# made here with this host's pip (build/wheels), so no `docker build` step reaches a network.
# Where a registry is reachable, the same Dockerfiles build FROM public bases instead
# (BASE_IMAGE=python:3.11-slim; docs/operations.md, "From one machine to a cluster").
#
# Usage: deploy/images/build.sh [TOOLCHAIN_DIR]     (run from anywhere; default <repo>/.toolchain)
# Prints each image's size at the end. An image replaced by a rebuild is removed once nothing uses it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TOOLCHAIN="${1:-$REPO/.toolchain}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
BASE="${FTBUS_BASE_IMAGE:-ftbus-base:bookworm}"

log() { printf '[images] %s\n' "$*" >&2; }

version="$("$PY" -c 'import tomllib; print(tomllib.load(open("'"$REPO"'/pyproject.toml", "rb"))["project"]["version"])')"
start=$(date +%s)

bash "$REPO/deploy/sandbox/engine.sh"
bash "$HERE/base.sh" "$BASE"
bash "$REPO/deploy/sandbox/build.sh" "$TOOLCHAIN" ftbus-sandbox:latest
docker tag ftbus-sandbox:latest "ftbus-sandbox:$version"

log "wheelhouse build/wheels: ftbus and its pinned dependencies (this host's pip)"
mkdir -p "$REPO/build/wheels"
rm -f "$REPO"/build/wheels/ftbus-*.whl
# Built from a copy of the sources: setuptools' own build/ folder stays out of the repository.
src="$(mktemp -d "${TMPDIR:-/tmp}/ftbus-wheel.XXXXXX")"
trap 'rm -rf "$src"' EXIT
cp -a "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/shared" "$REPO/runners" "$REPO/evaluation" "$REPO/services" "$REPO/ftbus" "$src/"
if ! "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$REPO/build/wheels" "$src" \
        >"$src/pip.log" 2>&1; then
    grep -v "^WARNING: Location 'file:" "$src/pip.log" >&2; log "pip wheel failed"; exit 1
fi

# One image at a time (2 cores); the classic builder (no BuildKit, no buildx needed).
build() {  # build TARGET NAME
    local target="$1" name="$2" old new
    old="$(docker image inspect -f '{{.Id}}' "$name:latest" 2>/dev/null || true)"
    log "docker build --target $target -t $name:latest -t $name:$version (FROM $BASE)"
    DOCKER_BUILDKIT=0 docker build --quiet --force-rm -f "$REPO/deploy/docker/services.Dockerfile" --target "$target" \
        --build-arg BASE_IMAGE="$BASE" --build-arg TOOLCHAIN_IMAGE=ftbus-sandbox:latest \
        --label "ftbus.version=$version" -t "$name:latest" -t "$name:$version" "$REPO" >/dev/null
    new="$(docker image inspect -f '{{.Id}}' "$name:latest")"
    if [ -n "$old" ] && [ "$old" != "$new" ] && [ -z "$(docker image inspect -f '{{.RepoTags}}' "$old" 2>/dev/null | tr -d '[]')" ]; then
        docker image rm "$old" >/dev/null 2>&1 || log "kept the replaced $name image $old: a container still uses it"
    fi
}
dangling_before="$(docker images -q --no-trunc --filter dangling=true | sort)"
build services ftbus-services
build toolchain ftbus-toolchain
# The classic builder keeps each intermediate stage (the services' virtualenv with the wheelhouse)
# as an untagged image: remove those this run left, nothing else.
for image in $(comm -13 <(echo "$dangling_before") <(docker images -q --no-trunc --filter dangling=true | sort)); do
    docker image rm "$image" >/dev/null 2>&1 || true
done

log "built in $(( $(date +%s) - start )) s"
printf '%-28s %10s\n' IMAGE SIZE
for image in "$BASE" "ftbus-sandbox:$version" "ftbus-services:$version" "ftbus-toolchain:$version"; do
    printf '%-28s %10s\n' "$image" "$(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
done
