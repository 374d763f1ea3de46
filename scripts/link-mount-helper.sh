#!/usr/bin/env bash
# Link this checkout's mount helper to /sbin/mount.fuse.tierfs (or to the
# path given as $1), so `mount -t fuse.tierfs` and fstab lines work.
#
# A node's own helper is never touched. The link is made only when the
# helper path is
#   - missing, or a dangling link, or
#   - a link to some checkout's venv (`*/.venv/bin/mount.fuse.tierfs`),
#     which a developer's `scripts/install.sh` made.
# A regular file, or a link anywhere else (a node set up by the README links
# /opt/tierfs/bin/mount.fuse.tierfs), is left as it is, with a note.
#
# Usage: scripts/link-mount-helper.sh [HELPER_PATH]   (root, for /sbin)
set -euo pipefail

log() { printf 'install: %s\n' "$*" >&2; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ours="$(pwd -P)/.venv/bin/mount.fuse.tierfs"
helper=${1:-/sbin/mount.fuse.tierfs}

[[ -x $ours ]] || { log "note: $ours is missing: run scripts/install.sh first"; exit 0; }

if [[ -L $helper ]]; then
    target=$(readlink "$helper")
    [[ $target == "$ours" ]] && exit 0
    if [[ -e $helper && $target != */.venv/bin/mount.fuse.tierfs ]]; then
        log "note: $helper links to $target (not a checkout's venv): left as it is"
        exit 0
    fi
elif [[ -e $helper ]]; then
    log "note: $helper exists and is not a link: left as it is"
    exit 0
fi
ln -sfn "$ours" "$helper"
log "linked $helper -> $ours (mount -t fuse.tierfs, fstab)"
