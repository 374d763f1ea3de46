#!/bin/bash
# Slurm Prolog: warm the tierfs cache with the job's dataset before it starts.
#
# It runs `tierfs preload --ready-fraction X` on the job's dataset: the
# prolog returns once X of the bytes are resident (default 0.3), and the rest
# of the preload goes on in the tierfs daemon while the job starts
# (`tierfs status MOUNT` shows it). The job's first files are then read from
# local disk, not from S3.
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
# TIERFS_READY_FRACTION (0 to 1, default 0.3; 1 waits for the whole dataset),
# TIERFS_PRELOAD_TIMEOUT (seconds; on timeout the preload goes on in the
# daemon only if the ready fraction was reached, else it is cancelled).
#
# The preload runs as the job's user (SLURM_JOB_UID, SLURM_JOB_GID and that
# user's groups, through setpriv), never as root: the daemon then fetches only
# what that user may read and counts the preload against that user's bounds,
# as if the user had typed the command. Without SLURM_JOB_UID nothing is
# preloaded.
#
# The preload is tagged slurm-<job id>; the epilog (epilog.sh) cancels it if
# it is still running when the job ends.
#
# A non-zero exit drains the node, so failures are logged (syslog tag
# tierfs-prolog) and the script still exits 0: the job then reads lazily.
set -u
PATH=/usr/local/bin:/usr/bin:/bin
TIERFS=${TIERFS:-/usr/local/bin/tierfs}
MNT=${TIERFS_MOUNT:-/mnt/data}
TIMEOUT=${TIERFS_PRELOAD_TIMEOUT:-1800}
READY=${TIERFS_READY_FRACTION:-0.3}

log() {
    logger -t tierfs-prolog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
    printf 'tierfs-prolog: %s\n' "$*" >&2
}

paths=${TIERFS_PRELOAD:-${SPANK_TIERFS_PRELOAD:-}}
if [[ -z $paths && ${SLURM_JOB_EXTRA:-} =~ (^|[[:space:],\&])tierfs_preload=([^[:space:],\&]+) ]]; then
    paths=${BASH_REMATCH[2]}
fi
[[ -n $paths ]] || exit 0

job_uid=${SLURM_JOB_UID:-}
if [[ ! $job_uid =~ ^[0-9]+$ ]]; then
    log "no SLURM_JOB_UID: not preloading $paths (it runs as the job's user, never as root)"
    exit 0
fi
as_job_user=()
if ((job_uid != 0)); then
    job_gid=${SLURM_JOB_GID:-}
    [[ $job_gid =~ ^[0-9]+$ ]] || job_gid=$(id -g "$job_uid" 2>/dev/null) || {
        log "no group for uid $job_uid: not preloading $paths"
        exit 0
    }
    groups=--init-groups
    id -nu "$job_uid" >/dev/null 2>&1 || groups=--clear-groups  # no passwd entry: no more groups
    as_job_user=(setpriv --reuid="$job_uid" --regid="$job_gid" "$groups" --)
fi

if ! "${as_job_user[@]}" "$TIERFS" preload --help >/dev/null 2>&1; then
    log "$TIERFS preload does not run; not preloading $paths"
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

log "preloading ${args[*]} as uid $job_uid (returning at $READY resident)"
# Tagged with the job id: the epilog cancels what is left when the job ends.
if timeout "$TIMEOUT" "${as_job_user[@]}" "$TIERFS" preload --ready-fraction "$READY" --tag "slurm-${SLURM_JOB_ID:-none}" \
    "${args[@]}" >/dev/null; then
    log "preload ready ($READY of the bytes resident; the rest goes on in the daemon)"
else
    log "preload failed or timed out (exit $?); the job will read lazily"
fi
exit 0
