#!/bin/bash
# Slurm Epilog: cancel the job's preload if it still runs, end the prefetch
# orders the job named after itself (job slurm-<job id>), and check that the
# tierfs mount is still alive after the job.
#
# slurm.conf:
#   Epilog=/etc/slurm/epilog.d/tierfs-epilog.sh
#
# The cache is left as it is, so that the next job on this node finds it warm.
# If the daemon died during the job, the mount point is dead ("Transport
# endpoint is not connected"): the script then exits 1, which makes Slurm
# drain the node instead of starting more jobs on a broken mount (systemd's
# Restart=on-failure brings tierfs back; resume the node after checking).
# Set TIERFS_EPILOG_DRAIN=0 to only log. Site settings: TIERFS (the CLI),
# TIERFS_MOUNT.
set -u
PATH=/usr/local/bin:/usr/bin:/bin
TIERFS=${TIERFS:-/usr/local/bin/tierfs}
MNT=${TIERFS_MOUNT:-/mnt/data}

log() {
    logger -t tierfs-epilog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
    printf 'tierfs-epilog: %s\n' "$*" >&2
}

# The prolog tagged the job's preload slurm-<job id>: a job that ended needs it no more.
if [[ -n ${SLURM_JOB_ID:-} ]] && out=$("$TIERFS" preload --cancel-tag "slurm-$SLURM_JOB_ID" "$MNT" 2>&1); then
    [[ $out == cancelled* ]] && log "$out"
fi

# Orders set with --job slurm-<job id> (tierfs prefetch, tierfs.client, tierfs.torch
# under Slurm): those of a process still holding its session end with it anyway.
if [[ -n ${SLURM_JOB_ID:-} ]] && out=$("$TIERFS" prefetch "$MNT" --clear --job "slurm-$SLURM_JOB_ID" 2>&1); then
    [[ $out == *"orders ended"*": none" ]] || log "$out"
fi

if findmnt -rn --mountpoint "$MNT" >/dev/null 2>&1 && ! err=$(stat -t "$MNT" 2>&1 >/dev/null); then
    log "tierfs mount $MNT is dead or broken: $err"
    [[ ${TIERFS_EPILOG_DRAIN:-1} == 0 ]] || exit 1
fi
exit 0
