#!/bin/bash
# Slurm Prolog: warm the tierfs cache with the job's dataset before it starts.
#
# PLANNED: `tierfs preload` is not implemented yet. Until it is, this script
# logs that it skipped the preload and exits 0.
#
# slurm.conf:
#   Prolog=/etc/slurm/prolog.d/tierfs-prolog.sh
#   PrologFlags=Alloc        # run at allocation, so the data is warm at start
#
# The Prolog runs as root and does NOT see the job's own environment. The
# paths to preload (relative to the mount, or absolute under it; several
# separated by ':') come from, in order:
#   TIERFS_PRELOAD           set by hand when testing this script
#   SPANK_TIERFS_PRELOAD     set by a SPANK plugin (spank_job_control_setenv)
#   SLURM_JOB_EXTRA          sbatch --extra=tierfs_preload=datasets/imagenet
# Site settings: TIERFS (the CLI), TIERFS_MOUNT (the mount point),
# TIERFS_PRELOAD_TIMEOUT (seconds).
#
# A non-zero exit drains the node, so failures are logged (syslog tag
# tierfs-prolog) and the script still exits 0: the job then reads lazily.
set -u
PATH=/usr/local/bin:/usr/bin:/bin
TIERFS=${TIERFS:-/usr/local/bin/tierfs}
MNT=${TIERFS_MOUNT:-/mnt/main}
TIMEOUT=${TIERFS_PRELOAD_TIMEOUT:-1800}

log() {
    logger -t tierfs-prolog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
    printf 'tierfs-prolog: %s\n' "$*" >&2
}

paths=${TIERFS_PRELOAD:-${SPANK_TIERFS_PRELOAD:-}}
if [[ -z $paths && ${SLURM_JOB_EXTRA:-} =~ (^|[[:space:],\&])tierfs_preload=([^[:space:],\&]+) ]]; then
    paths=${BASH_REMATCH[2]}
fi
[[ -n $paths ]] || exit 0

if ! "$TIERFS" preload --help >/dev/null 2>&1; then
    log "tierfs preload is not available yet (planned); not preloading $paths"
    exit 0
fi

args=()
IFS=: read -ra items <<<"$paths"
for p in "${items[@]}"; do
    [[ -n $p ]] || continue
    case "/$p/" in
        */../* | */./*) log "rejecting '$p': '.' and '..' are not allowed"; continue ;;
    esac
    [[ $p == /* ]] || p=$MNT/$p
    if [[ $p != "$MNT"/* ]]; then
        log "rejecting '$p': not under $MNT"
        continue
    fi
    args+=("$p")
done
((${#args[@]} > 0)) || exit 0

log "preloading ${args[*]}"
if timeout "$TIMEOUT" "$TIERFS" preload "${args[@]}" >/dev/null; then
    log "preload done"
else
    log "preload failed or timed out (exit $?); the job will read lazily"
fi
exit 0
