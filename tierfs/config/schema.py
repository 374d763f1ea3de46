"""The config file's schema: one description of every table and key.

Each config table is a frozen dataclass; each of its TOML keys is a field
declared with ``key(default, converter, kind, doc)``.  That one line is
all a new key needs: the loader checks and converts it (every problem at
its file:line), ``tierfs policy check`` runs the loader, and the table of
keys in the README is generated from the same fields
(``tierfs.config.reference``).  Fields declared without ``key`` are
derived by the loader, never read from the file (``RuleConfig.source``,
``MetricsConfig.host``).

``SECTIONS`` lists the tables in the order of the file, with what the
loader needs to know of each table as a whole: required or not, one table
or an array of tables (``[[tiers]]``), and an example for messages.
Checks that involve several keys (watermarks, block size against
readahead, contradictions inside a rule) are functions of the loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from .values import (
    conv_access_root,
    conv_backing_url,
    conv_block_size,
    conv_bool,
    conv_choice,
    conv_duration,
    conv_endpoint,
    conv_glob,
    conv_int,
    conv_listen,
    conv_mode,
    conv_part_size,
    conv_path,
    conv_positive_duration,
    conv_positive_size,
    conv_profile,
    conv_quota_name,
    conv_quota_path,
    conv_rate,
    conv_region,
    conv_shared_url,
    conv_size,
    conv_size_in,
    conv_str,
    conv_tier_name,
    conv_watermark,
)

DEFAULT_HIGH_WATERMARK = 0.90
DEFAULT_LOW_WATERMARK = 0.80
MAX_CONCURRENCY = 1024
MAX_DIR_READAHEAD = 1024
MAX_ID = 2**32 - 2
WRITE_MODES = ("back", "through")
conv_id = conv_int(0, MAX_ID)
PROMOTE_MODES = ("on_access", "never")


@dataclass(frozen=True, slots=True)
class Key:
    """What the loader and the reference need to know of one TOML key."""

    #: TOML value -> value (``ValueError`` with a sentence); for a ``path``
    #: key, a function of the config file's directory that returns one.
    convert: Callable[..., Any]
    #: What a user writes, for the reference ("size", "duration", ...).
    kind: str
    #: One line: what the key does.
    doc: str
    required: bool = False
    #: Relative to the config file's directory.
    path: bool = False
    #: The default as a user would write it ("" when there is none).
    shown_default: str = ""


def key(
    default: Any,
    convert: Callable[..., Any],
    kind: str,
    doc: str,
    *,
    shown: str = "",
    path: bool = False,
) -> Any:
    """An optional key with its default."""
    return field(default=default, metadata={"key": Key(convert, kind, doc, False, path, shown)})


def required_key(convert: Callable[..., Any], kind: str, doc: str, *, path: bool = False) -> Any:
    """A key the table must have."""
    return field(metadata={"key": Key(convert, kind, doc, True, path)})


def keys_of(cls: type) -> list[tuple[Field[Any], Key]]:
    """The TOML keys of a config table, in declaration order."""
    return [(f, f.metadata["key"]) for f in fields(cls) if "key" in f.metadata]


def default_of(f: Field[Any]) -> Any:
    return None if f.default is MISSING else f.default


@dataclass(frozen=True, slots=True)
class BackingConfig:
    url: str = required_key(
        conv_backing_url, "URL", '"s3://bucket/prefix", or "file:///dir" for a local directory'
    )
    endpoint_url: str | None = key(
        None, conv_endpoint, "URL", "an S3-compatible endpoint, http(s)://host[:port]"
    )
    region: str | None = key(None, conv_region, "string", "the region to sign requests for")


@dataclass(frozen=True, slots=True)
class StateConfig:
    dir: Path = required_key(
        conv_path, "path", "LMDB metadata and the daemon log; one per bucket, on NVMe", path=True
    )


@dataclass(frozen=True, slots=True)
class TierConfig:
    name: str = required_key(conv_tier_name, "name", "unique; `place` and `tierfs pin` use it")
    path: Path = required_key(
        conv_path, "path", "an existing writable directory, not inside another tier's", path=True
    )
    #: bytes; None = the size of the filesystem holding ``path``
    capacity: int | None = key(
        None, conv_positive_size, "size", "bytes this tier may hold", shown="its filesystem"
    )
    high_watermark: float = key(
        DEFAULT_HIGH_WATERMARK,
        conv_watermark,
        "fraction",
        "the mover drains a tier above this share of its capacity...",
    )
    low_watermark: float = key(
        DEFAULT_LOW_WATERMARK, conv_watermark, "fraction", "...down to this share"
    )


@dataclass(frozen=True, slots=True)
class SharedTierConfig:
    """A ``[[tiers]]`` entry with ``url`` instead of ``path``: the shared tier."""

    name: str = required_key(conv_tier_name, "name", "unique among the tiers")
    url: str = required_key(
        conv_shared_url, "URL", '"s3://bucket/prefix" on a cluster near the nodes, shared by all'
    )
    endpoint_url: str | None = key(
        None, conv_endpoint, "URL", "its S3-compatible endpoint, http(s)://host[:port]"
    )
    region: str | None = key(None, conv_region, "string", "the region to sign requests for")
    profile: str | None = key(
        None, conv_profile, "string", "the ~/.aws profile of its credentials (default chain)"
    )
    timeout: float = key(
        2.0,
        conv_duration,
        "duration",
        "to connect and between bytes; a slower tier is skipped for the bucket",
    )


@dataclass(frozen=True, slots=True)
class FetchConfig:
    block_size: int = key(
        4 * 1024 * 1024,
        conv_block_size,
        "size",
        "the unit of fetch, cache and checksum: a power of two, 64KiB to 1GiB",
    )
    readahead_max: int = key(
        256 * 1024 * 1024,
        conv_size,
        "size",
        "the widest readahead window of a sequential reader",
    )
    concurrency: int = key(
        32, conv_int(1, MAX_CONCURRENCY), "integer", "GETs in flight at most (1 to 1024)"
    )
    #: Files fetched ahead of a reader that opens a directory's files in
    #: listing order (``tierfs.workers.dirahead``); 0 turns it off.
    dir_readahead: int = key(
        32,
        conv_int(0, MAX_DIR_READAHEAD),
        "integer",
        "files fetched ahead of a reader that opens a directory in listing order; 0 = off",
    )


@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    list_ttl: float = key(60.0, conv_duration, "duration", "how long a directory listing is used")
    revalidate_ttl: float = key(
        60.0,
        conv_duration,
        "duration",
        "how long a cached file is served before an open checks its ETag",
    )
    file_mode: int = key(0o644, conv_mode(0o777), "mode", "of objects without stored attributes")
    dir_mode: int = key(0o755, conv_mode(0o1777), "mode", "of directories without stored ones")
    uid: int | None = key(
        None, conv_id, "integer", "owner when none is stored", shown="the daemon's"
    )
    gid: int | None = key(
        None, conv_id, "integer", "group when none is stored", shown="the daemon's"
    )


@dataclass(frozen=True, slots=True)
class WriteConfig:
    mode: str = key(
        "back",
        conv_choice(*WRITE_MODES),
        '"back" or "through"',
        "through: close and fsync wait for the bucket",
    )
    upload_delay: float = key(
        5.0, conv_duration, "duration", "upload this long after the last close"
    )
    space_wait: float = key(
        60.0,
        conv_duration,
        "duration",
        "a writer waits this long for uploads to free tier space, then ENOSPC",
    )
    part_size: int = key(
        32 << 20,
        conv_part_size,
        "size",
        "smallest multipart part (5MiB to 5GiB); smaller files are one PUT",
    )
    deletes: bool = key(
        True,
        conv_bool,
        "boolean",
        "false: unlink, rmdir and a rename over a name fail with EPERM; nothing is deleted",
    )


@dataclass(frozen=True, slots=True)
class RuleConfig:
    match: str = required_key(
        conv_glob, "glob", "paths from the mount root; `*` in one segment, `**` across"
    )
    #: "file:line" where the rule starts, for messages
    source: str = ""
    place: str | None = key(None, conv_str, "tier name", "new data goes to this tier first")
    keep_newest: int | None = key(
        None, conv_int(1), "integer", "per directory, the newest N entries stay on the first tier"
    )
    #: seconds
    demote_after: float | None = key(
        None, conv_duration, "duration", "not accessed for that long: leaves the first tier"
    )
    #: seconds
    evict_after: float | None = key(
        None, conv_duration, "duration", "not accessed for that long: local copies dropped"
    )
    write: str | None = key(
        None,
        conv_choice(*WRITE_MODES),
        '"back" or "through"',
        "overrides [write] mode for these files",
        shown="[write] mode",
    )
    pin: bool | None = key(None, conv_bool, "boolean", "never demoted or evicted")
    promote: str | None = key(
        None,
        conv_choice(*PROMOTE_MODES),
        '"on_access" or "never"',
        "copy back up after a read from a slower tier",
        shown='"on_access"',
    )
    cache: bool | None = key(
        None, conv_bool, "boolean", "false: reads stream, nothing is kept", shown="true"
    )
    share: bool | None = key(
        None,
        conv_bool,
        "boolean",
        "false: kept out of the shared tier: reads go to the bucket, written files are not copied",
        shown="true",
    )


@dataclass(frozen=True, slots=True)
class MoverConfig:
    interval: float = key(
        5.0,
        conv_positive_duration,
        "duration",
        "how often the tiers are checked when nothing wakes the mover",
    )
    #: bytes per second; 0 = no cap
    bandwidth: int = key(
        0, conv_rate, "rate", 'caps the mover\'s copies, like "200MiB/s"; "0" = no cap', shown='"0"'
    )


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    #: "host:port" as written; None = metrics off
    listen: str | None = key(
        None,
        conv_listen,
        '"host:port"',
        "serve Prometheus text at /metrics there",
        shown="off",
    )
    #: without the brackets of an IPv6 address
    host: str = ""
    port: int = 0

    @property
    def enabled(self) -> bool:
        return self.listen is not None


@dataclass(frozen=True, slots=True)
class AccessConfig:
    #: A directory of the bucket (under ``[backing] url``'s prefix) that
    #: becomes the mount's root; the loader adds it to ``Config.backing.url``.
    root: str | None = key(
        None,
        conv_access_root,
        "path",
        "the mount shows only this directory of the bucket (under url's prefix), as its root",
        shown="the whole prefix",
    )
    uid: int | None = key(
        None,
        conv_id,
        "integer",
        "every file shows this owner and new ones get it; chown is refused",
        shown="stored owners",
    )
    gid: int | None = key(
        None,
        conv_id,
        "integer",
        "every file shows this group and new ones get it",
        shown="stored groups",
    )
    umask: int = key(
        0,
        conv_mode(0o777),
        "mode",
        "cleared from the mode of every new file and directory",
        shown='"0000"',
    )
    read_only: bool = key(False, conv_bool, "boolean", "mount read-only, as -o ro does")


@dataclass(frozen=True, slots=True)
class AuditConfig:
    #: None = no audit log
    path: Path | None = key(
        None,
        conv_path,
        "path",
        "write the audit log there: one JSON line per change, who, what, which file",
        shown="off",
        path=True,
    )
    reads: bool = key(False, conv_bool, "boolean", "also record every open for reading")
    max_size: int = key(
        100 << 20,
        conv_size_in(1 << 20, None, "the audit log's max_size is at least 1MiB"),
        "size",
        "start a new file at this size (PATH.1, PATH.2... are the older ones)",
        shown='"100MiB"',
    )
    keep: int = key(5, conv_int(0, 1000), "integer", "older files kept beside the current one")

    @property
    def enabled(self) -> bool:
        return self.path is not None


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    path: str = required_key(
        conv_quota_path,
        "path",
        'a directory from the mount root ("" = all of it); the quota covers everything below it',
    )
    #: "file:line" where the quota starts, for messages
    source: str = ""
    name: str | None = key(
        None,
        conv_quota_name,
        "name",
        "the label of its metrics (a quota without a name is only counted in the totals)",
        shown="no label",
    )
    bytes: int | None = key(
        None,
        conv_positive_size,
        "size",
        'most bytes the files below it may hold, like "500GiB"',
        shown="no limit",
    )
    files: int | None = key(
        None,
        conv_int(1),
        "integer",
        "most names (files, directories, symlinks) below it",
        shown="no limit",
    )
    warn_at: float = key(
        0.8, conv_watermark, "fraction", "warn once the usage crosses this share of a limit"
    )


@dataclass(frozen=True, slots=True)
class Config:
    source: Path
    backing: BackingConfig
    state: StateConfig
    tiers: tuple[TierConfig, ...]
    #: The ``[[tiers]]`` entry with a ``url`` (after the local tiers, at most one).
    shared_tier: SharedTierConfig | None = None
    fetch: FetchConfig = field(default_factory=FetchConfig)
    namespace: NamespaceConfig = field(default_factory=NamespaceConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    mover: MoverConfig = field(default_factory=MoverConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    rules: tuple[RuleConfig, ...] = ()
    quotas: tuple[QuotaConfig, ...] = ()
    policy_files: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class Section:
    """One table of the config file."""

    name: str
    cls: type
    #: What the table is for (one line, for the reference).
    doc: str
    #: How to write it, for the message when it has the wrong type.
    example: str
    #: An array of tables (``[[tiers]]``).
    array: bool = False
    #: Entries of the array that have this key are of ``variant`` instead
    #: (a ``[[tiers]]`` entry with ``url`` is the shared tier).
    variant_key: str = ""
    variant: type | None = None
    variant_doc: str = ""
    #: The message when the file lacks it ("" when it may).
    missing: str = ""


SECTIONS = (
    Section(
        "backing",
        BackingConfig,
        "the bucket: the durable copy",
        '[backing] with url = "s3://bucket/prefix"',
        missing='the [backing] table is missing; add [backing] with url = "s3://bucket"',
    ),
    Section(
        "state",
        StateConfig,
        "the node's metadata",
        '[state] with dir = "/var/lib/tierfs"',
        missing='the [state] table is missing; add [state] with dir = "/var/lib/tierfs"',
    ),
    Section(
        "tiers",
        TierConfig,
        "local tiers, fastest first",
        "[[tiers]]",
        array=True,
        variant_key="url",
        variant=SharedTierConfig,
        variant_doc="the shared tier: a bucket near the nodes, after the local tiers, at most one",
        missing="no tiers are configured; add at least one [[tiers]] with a name and a path",
    ),
    Section("fetch", FetchConfig, "reads from the bucket", "[fetch]"),
    Section("namespace", NamespaceConfig, "names and attributes", "[namespace]"),
    Section("write", WriteConfig, "writes and uploads", "[write]"),
    Section("mover", MoverConfig, "the lifecycle mover", "[mover]"),
    Section(
        "metrics", MetricsConfig, "Prometheus metrics", '[metrics] with listen = "127.0.0.1:9581"'
    ),
    Section(
        "audit",
        AuditConfig,
        "the audit log",
        '[audit] with path = "/var/log/tierfs/main.audit.jsonl"',
    ),
    Section(
        "access",
        AccessConfig,
        "an access point: one directory of the bucket, with a fixed owner",
        '[access] with root = "users/alice"',
    ),
    Section("rules", RuleConfig, "lifecycle rules; first match wins", "[[rules]]", array=True),
    Section(
        "quotas",
        QuotaConfig,
        "directory quotas: bytes and names below a directory",
        "[[quotas]]",
        array=True,
    ),
)

SECTION = {s.name: s for s in SECTIONS}

#: Keys of the top level: the tables, and the list of policy files.
TOP_KEYS = (*(s.name for s in SECTIONS), "policy_files")
