"""``mount.fuse.tierfs``: the helper mount(8) runs for ``-t fuse.tierfs``.

So that tierfs mounts like any filesystem::

    mount -t fuse.tierfs /etc/tierfs/data.toml /mnt/data -o allow_other
    # /etc/fstab:
    /etc/tierfs/data.toml /mnt/data fuse.tierfs allow_other,_netdev,nofail 0 0

mount(8) looks for ``/sbin/mount.fuse.tierfs`` (``scripts/install.sh``
links it there when run as root) and calls it as ``mount.fuse.tierfs
SOURCE MOUNTPOINT [-sfnvrw] [-N NS] [-o OPTIONS] [-t TYPE]``, where SOURCE
is the config file.  This turns that into ``tierfs mount CONFIG MOUNTPOINT
-o OPTIONS``, which returns once the mount is ready (or fails with one
sentence and exit 1).  Options that only mount(8), systemd or the kernel's
generic flags mean (``defaults``, ``rw``, ``_netdev``, ``nofail``,
``x-systemd.*``, ``nosuid``, ...) are dropped; ``ro``, ``allow_other``,
``allow_root``, ``debug`` and ``no_kernel_tuning`` go to the daemon; any
other option is an error that names it.  ``umount MOUNTPOINT`` unmounts;
the daemon then ends cleanly (pending uploads stay in the journal).
"""

from __future__ import annotations

import sys

from tierfs import cli

#: Options the daemon takes.
PASSED = frozenset({"ro", "allow_other", "allow_root", "debug", "no_kernel_tuning"})
#: Options with a value the daemon takes (``snapshot=NAME``: mount that snapshot).
PASSED_WITH_VALUE = frozenset({"snapshot"})
#: Options of mount(8), systemd and the generic mount flags: not the daemon's.
IGNORED = frozenset(
    {
        "defaults",
        "rw",
        "auto",
        "noauto",
        "nofail",
        "_netdev",
        "user",
        "users",
        "nouser",
        "owner",
        "group",
        "dev",
        "nodev",
        "suid",
        "nosuid",
        "exec",
        "noexec",
        "atime",
        "noatime",
        "relatime",
        "norelatime",
        "strictatime",
        "lazytime",
        "sync",
        "async",
        "silent",
        "loud",
    }
)


class HelperError(Exception):
    """Bad arguments: one sentence, exit 1."""


def daemon_options(options: str) -> list[str]:
    """The options of ``-o`` that go to the daemon, in order; HelperError
    for one that is neither the daemon's nor a known mount(8) option."""
    kept: list[str] = []
    for option in filter(None, (o.strip() for o in options.split(","))):
        name = option.split("=", 1)[0]
        if option in PASSED or (name in PASSED_WITH_VALUE and "=" in option):
            kept.append(option)
        elif name in IGNORED or name == "comment" or name.startswith("x-"):
            continue
        else:
            known = ", ".join(sorted(PASSED | {f"{v}=NAME" for v in PASSED_WITH_VALUE}))
            raise HelperError(f"unknown mount option {option!r}; tierfs takes {known}")
    return kept


def parse(argv: list[str]) -> tuple[str, str, list[str]]:
    """(config, mount point, daemon options) of mount(8)'s helper arguments."""
    positional: list[str] = []
    options: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-o", "-N", "-t"):
            value = next(args, None)
            if value is None:
                raise HelperError(f"{arg} needs a value")
            if arg == "-o":
                options += daemon_options(value)
        elif arg.startswith("-o") and len(arg) > 2:
            options += daemon_options(arg[2:])
        elif arg.startswith("-") and len(arg) > 1:
            if "r" in arg[1:]:
                options.append("ro")  # -r: read-only, as -o ro
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise HelperError("usage: mount.fuse.tierfs CONFIG MOUNTPOINT [-o OPTIONS]")
    return positional[0], positional[1], list(dict.fromkeys(options))


HELP = """\
usage: mount.fuse.tierfs CONFIG MOUNTPOINT [-o OPTIONS]

The helper mount(8) runs for `mount -t fuse.tierfs` and fstab lines of type
fuse.tierfs: it mounts the bucket of the tierfs config file CONFIG on
MOUNTPOINT (as `tierfs mount` does) and returns once the mount is ready.

  mount -t fuse.tierfs /etc/tierfs/data.toml /mnt/data -o allow_other
  /etc/fstab: /etc/tierfs/data.toml /mnt/data fuse.tierfs allow_other,_netdev,nofail 0 0

options for tierfs: ro, allow_other, allow_root, debug, no_kernel_tuning;
those of mount(8) and systemd (defaults, rw, _netdev, nofail, x-systemd.*,
nosuid, ...) are accepted and left to them; any other is an error.
`umount MOUNTPOINT` unmounts, and the daemon ends cleanly.
"""


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if any(word in ("-h", "--help") for word in words):
        print(HELP, end="")
        return 0
    try:
        config, mountpoint, options = parse(words)
    except HelperError as exc:
        print(f"mount.fuse.tierfs: {exc}", file=sys.stderr)
        return 1
    command = ["mount", config, mountpoint]
    if options:
        command += ["-o", ",".join(options)]
    return cli.main(command)


if __name__ == "__main__":
    sys.exit(main())
