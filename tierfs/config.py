"""Config file (TOML) -> frozen dataclasses.

SKELETON: the dataclasses below are the interface the rest of tierfs codes
against.  ``load_config`` and ``check_file`` are implemented by the config
work item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BackingConfig:
    url: str  # "s3://bucket/prefix" or "file:///dir"
    endpoint_url: str | None = None
    region: str | None = None


@dataclass(frozen=True, slots=True)
class StateConfig:
    dir: Path


@dataclass(frozen=True, slots=True)
class TierConfig:
    name: str
    path: Path
    capacity: int | None  # bytes; None = size of the filesystem holding `path`
    high_watermark: float  # 0 < low < high <= 1
    low_watermark: float


@dataclass(frozen=True, slots=True)
class FetchConfig:
    block_size: int = 4 * 1024 * 1024
    readahead_max: int = 256 * 1024 * 1024
    concurrency: int = 32


@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    list_ttl: float = 60.0  # seconds
    revalidate_ttl: float = 60.0  # seconds
    file_mode: int = 0o644
    dir_mode: int = 0o755
    uid: int | None = None  # None = the daemon's uid
    gid: int | None = None


@dataclass(frozen=True, slots=True)
class WriteConfig:
    mode: str = "back"  # "back" | "through"
    upload_delay: float = 5.0


@dataclass(frozen=True, slots=True)
class RuleConfig:
    match: str
    source: str  # "file:line" where the rule starts, for messages
    place: str | None = None
    keep_newest: int | None = None
    demote_after: float | None = None
    write: str | None = None
    pin: bool | None = None
    promote: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    source: Path
    backing: BackingConfig
    state: StateConfig
    tiers: tuple[TierConfig, ...]
    fetch: FetchConfig = field(default_factory=FetchConfig)
    namespace: NamespaceConfig = field(default_factory=NamespaceConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    rules: tuple[RuleConfig, ...] = ()
    policy_files: tuple[Path, ...] = ()
