#!/usr/bin/env bash
# Install what tierfs needs on a fresh Debian 12 machine, then the project
# itself (editable, with test extras) into ./.venv at the repository root.
#
# Idempotent: a second run changes nothing and takes a second or two.
# Run as root (apt, /dev/fuse, fusectl). Works from any cwd.
#
# Environment:
#   TIERFS_FORCE_INSTALL=1   re-run `pip install -e '.[test]'` even if the
#                            stamp says the venv is up to date
#   PYTHON=/path/to/python   use this interpreter (must be >= 3.11)
set -euo pipefail

log() { printf 'install: %s\n' "$*" >&2; }
die() { printf 'install: ERROR: %s\n' "$*" >&2; exit 1; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT=$(pwd -P)

APT_PACKAGES=(fuse3 libfuse3-dev pkg-config python3-dev python3-venv gcc)

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        return 1
    fi
}

# --- 1. Debian packages -----------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed'; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]} == 0)); then
    log "apt packages already installed"
else
    command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get: install them by hand"
    [[ $EUID -eq 0 ]] || command -v sudo >/dev/null 2>&1 || die "missing packages (${missing[*]}): run as root"
    export DEBIAN_FRONTEND=noninteractive
    apt_install() { as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
    # `apt-get update` only when needed: no package lists at all, or the
    # install fails against the lists we have (stale or incomplete).
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
        log "apt-get update (no package lists yet)"
        as_root apt-get update -qq >/dev/null
    fi
    log "apt-get install ${missing[*]}"
    if ! apt_install; then
        log "install failed; apt-get update and retry"
        as_root apt-get update -qq >/dev/null
        apt_install || die "apt-get install ${missing[*]} failed"
    fi
fi

# --- 2. /dev/fuse and fusectl (FUSE mounts and tuning need them) ------------
if [[ ! -e /dev/fuse ]]; then
    log "creating /dev/fuse"
    if as_root mknod -m 0666 /dev/fuse c 10 229 2>/dev/null; then
        :
    else
        log "WARNING: could not create /dev/fuse: FUSE mounts (demo, fuse tests) will fail"
    fi
fi
if [[ -d /sys/fs/fuse/connections ]] && command -v mountpoint >/dev/null 2>&1 \
    && ! mountpoint -q /sys/fs/fuse/connections; then
    # Best effort: lets the daemon raise max_background on its connection.
    as_root modprobe fuse >/dev/null 2>&1 || true
    if as_root mount -t fusectl fusectl /sys/fs/fuse/connections >/dev/null 2>&1; then
        log "mounted fusectl at /sys/fs/fuse/connections"
    else
        log "note: could not mount fusectl (fine in containers; only tuning needs it)"
    fi
fi

# --- 3. Python >= 3.11 ------------------------------------------------------
python_ok() {
    # >= 3.11 and able to build a venv with pip (Debian needs python3-venv).
    "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

venv_ok() {
    [[ -x .venv/bin/python ]] && python_ok .venv/bin/python
}

if ! venv_ok; then
    if [[ -e .venv ]]; then
        log "existing .venv is broken or too old; recreating it"
        rm -rf .venv
    fi
    py=""
    for cand in ${PYTHON:-} python3.11 python3 python3.12 python3.13 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && python_ok "$cand"; then
            py=$cand
            break
        fi
    done
    [[ -n $py ]] || die "no Python >= 3.11 with venv support found (tried python3.11, python3, /usr/bin/python3)"
    log "creating .venv with $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
    "$py" -m venv .venv || die "python -m venv failed"
fi

# --- 4. The project, editable, with test extras -----------------------------
# A stamp avoids re-running pip (several seconds) when nothing it depends on
# changed: pyproject.toml and the interpreter.
stamp=.venv/.tierfs-install-stamp
want=$( { cat pyproject.toml; .venv/bin/python -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
if [[ ${TIERFS_FORCE_INSTALL:-0} != 1 && -f $stamp && $(cat "$stamp") == "$want" ]] \
    && [[ -x .venv/bin/tierfs && -x .venv/bin/pytest && -x .venv/bin/ruff ]]; then
    log "venv up to date (.venv)"
else
    log "pip install -e '.[test]' into .venv (this takes a minute the first time)"
    rm -f "$stamp"
    if ! .venv/bin/python -m pip install -qq --disable-pip-version-check -e '.[test]'; then
        die "pip install -e '.[test]' failed (see the errors above)"
    fi
    printf '%s\n' "$want" >"$stamp"
fi

# --- 5. The mount helper: `mount -t fuse.tierfs` and fstab lines ------------
# mount(8) looks for /sbin/mount.fuse.tierfs. Link this venv's there (root
# only), unless the node has its own helper: see scripts/link-mount-helper.sh.
if [[ $EUID -eq 0 ]]; then
    bash scripts/link-mount-helper.sh /sbin/mount.fuse.tierfs
fi

log "ok: $REPO_ROOT/.venv ($(.venv/bin/python -c 'import sys; print(sys.version.split()[0])'))"
