"""Config file (TOML) -> frozen dataclasses, with every problem at its file:line.

The package, by job: ``schema`` (one description of every table and key:
the dataclasses the rest of tierfs codes against, each key declared once
with its converter, default and doc line), ``loader`` (reading, checking,
converting, the checks across keys, policy files), ``values`` (the
converters of single values), ``toml_lines`` (which line holds a key) and
``reference`` (the table of keys in the README, generated from the schema).

Entry points
------------
``load_config(path, *, check_paths=True) -> Config``
    Parses and validates a config file and the policy files it lists.  Raises
    ``ConfigError`` holding *all* problems found, each as ``(file, line,
    sentence)``; line 0 means "no single line" (a missing table).
``check_file(path, *, check_paths=True) -> list[(file, line, sentence)]``
    What ``tierfs policy check FILE`` runs.  Accepts a full config or a policy
    file (a file that holds only ``[[rules]]``); an empty list means OK.
``load_policy(path, *, tiers=None) -> tuple[RuleConfig, ...]``
    Loads one policy file (used for policy reloads).
``parse_backing_url(url) -> BackingURL``
    Splits ``s3://bucket/prefix`` / ``file:///dir`` (for the store layer).

``check_paths=False`` skips the checks that look at the local filesystem
(tier directories exist and are writable, the state dir can be created, two
tiers are the same directory after resolving symlinks).  Policy files are
always read, since their rules are part of the config.

Rules
-----
* Parsed with ``tomllib``; a UTF-8 BOM is allowed.  A TOML syntax error is
  reported at the line tomllib names; any other problem at the line of its
  key (``toml_lines``).  A problem with a missing key is reported at the
  header of the table that lacks it.
* Unknown keys are errors, anywhere, with a "did you mean" suggestion; their
  values are never echoed (they could be secrets).  Credentials are never read
  from the config: a key that looks like one gets a pointer to the AWS chain.
* ``[backing]``: ``url`` required, ``s3://bucket[/prefix]`` (AWS bucket-name
  rules, no empty/``.``/``..`` prefix segments) or ``file:///absolute/dir``;
  ``endpoint_url`` optional ``http(s)://host[:port]`` without credentials;
  ``region`` optional.
* ``[state]``: ``dir`` required.  It must be a writable directory, or not
  exist yet under a writable parent (the daemon creates it), and must not be a
  tier directory.
* ``[[tiers]]``, fastest first, at least one: ``name`` required, unique,
  ``[A-Za-z][A-Za-z0-9_-]*`` up to 63 chars; ``path`` required, an existing
  writable directory (``os.access(W_OK | X_OK)``), not the same as or nested
  in another tier's; ``capacity`` optional size > 0; ``high_watermark`` /
  ``low_watermark`` default 0.90 / 0.80, written ``0.8`` or ``"80%"``, each in
  (0, 1], low < high.
* ``[fetch]``: ``block_size`` a **power of two** from 64 KiB to 1 GiB (so a
  block is a whole number of pages and of 128 KiB FUSE requests, and block
  arithmetic is shifts); ``readahead_max`` >= ``block_size``; ``concurrency``
  1..1024; ``dir_readahead`` (files) 0..1024, 0 = off.
* ``[namespace]``: ``list_ttl`` / ``revalidate_ttl`` durations >= 0;
  ``file_mode`` / ``dir_mode`` an octal string ("0644", "644", "0o644") or a
  TOML integer (``0o644``).  An integer must be <= 0o777, which catches 644
  written in decimal; the string form of ``dir_mode`` may add the sticky bit
  ("1777").  ``uid`` / ``gid`` optional integers in 0..2**32-2.
* ``[write]``: ``mode`` "back" | "through"; ``upload_delay`` duration >= 0;
  ``space_wait`` duration >= 0 (how long a writer waits for uploads to free
  tier space before ENOSPC); ``part_size`` size in 5 MiB..5 GiB, the smallest
  multipart part (files up to it go up in one PUT; larger parts are used when
  10,000 would not hold the file).
* ``[mover]``: ``interval`` duration > 0 (default "5s"): how often the tiers
  are checked when nothing wakes the mover; ``bandwidth`` a rate that caps
  the mover's copies, default "0" = no cap.  A rate is a size per second:
  "200MiB/s", "1.5GB/s", "200M/s" or "200MiB" (the "/s" may be left out;
  size units as for sizes, so "M" is binary); other time bases ("/h") are
  rejected.  A TOML integer is bytes per second.
* ``[metrics]``: ``listen`` = "host:port" (Prometheus text at /metrics); no
  ``listen`` (or no table) means metrics are off.  The host is an IPv4
  address, a bracketed IPv6 address ("[::1]:9581") or a host name; the port
  1..65535.  A non-loopback host such as "0.0.0.0" is allowed: the metrics
  carry no file names and no credentials, but then anyone who can reach the
  node can read them, so put such a port behind a firewall.
* ``[audit]``: ``path`` of the audit log (relative to the config file's
  directory; no path, no log: a table with keys but no path is an error),
  ``reads`` boolean (also every open for reading), ``max_size`` >= 1MiB
  (rotation), ``keep`` 0..1000 rotated files.
* ``[access]``: an access point.  ``root`` (a directory of the bucket,
  relative to the backing prefix, no '.' or '..' segment) is added to
  ``[backing] url``: the loaded ``Config.backing.url`` names the
  directory, so every key the daemon uses, the mount's source and the
  state directory's remembered URL are the access point's.  ``uid`` /
  ``gid`` fixed owner, ``umask`` mode, ``read_only`` boolean.
* ``[[rules]]``: ``match`` glob required (relative to the mount root, no
  leading "/", no "." or ".." segment, no empty segment; a trailing "/" is
  ignored); ``place`` must name a configured tier; ``keep_newest`` integer
  >= 1; ``demote_after`` / ``evict_after`` durations; ``write`` "back" |
  "through"; ``pin`` boolean; ``promote`` "on_access" | "never"; ``cache``
  boolean.  First match wins, so a rule whose pattern repeats an earlier one
  is an error.  (Wider shadowing, such as "data/**" before "data/x/*", is
  found by ``tierfs.policy.rules.shadowed_rules`` for ``policy check``.)
  Contradictions inside one rule are errors, reported at the line of the
  second key named:

  - ``pin = true`` with ``demote_after`` or ``evict_after``: a pinned file
    is never demoted or evicted;
  - ``pin = true`` with ``keep_newest``: every pinned entry stays anyway;
  - ``cache = false`` with ``pin = true``, ``place``, ``keep_newest``,
    ``promote = "on_access"``, ``demote_after`` or ``evict_after``: nothing
    is kept locally, so none of them can act (``write`` is allowed: new data
    is staged on the first tier with room until it is uploaded);
  - ``keep_newest`` with ``place`` naming a tier other than the first: the
    newest entries are kept on the first tier (checked when the tiers are
    known, i.e. not for a policy file checked alone);
  - ``evict_after`` not longer than ``demote_after``: the local copies would
    be dropped before the demotion could happen.
* ``[[quotas]]``: ``path`` (a directory from the mount root, "" for all of
  it) with ``bytes`` and/or ``files`` (at least one), ``warn_at`` in
  (0, 1]; one entry per path across the config and its policy files.
* ``policy_files = [...]``: paths relative to the config file's directory;
  each file holds only ``[[rules]]`` and ``[[quotas]]`` and its problems
  carry ITS file:line.  Their rules come after the inline rules, in list
  order.
* Relative paths resolve against the config file's directory; ``~`` expands.
  ``Config.source`` and all paths in the result are absolute (not
  symlink-resolved).  Messages name a file the way the caller spelled it.
"""

from .loader import Problem, check_file, load_config, load_policy
from .schema import (
    AccessConfig,
    AuditConfig,
    BackingConfig,
    Config,
    FetchConfig,
    MetricsConfig,
    MoverConfig,
    NamespaceConfig,
    QuotaConfig,
    RuleConfig,
    SharedTierConfig,
    StateConfig,
    TierConfig,
    WriteConfig,
)
from .toml_lines import KeyPath, TomlLocator
from .values import BackingURL, parse_backing_url

__all__ = [
    "AccessConfig",
    "AuditConfig",
    "BackingConfig",
    "BackingURL",
    "Config",
    "FetchConfig",
    "KeyPath",
    "MetricsConfig",
    "MoverConfig",
    "NamespaceConfig",
    "Problem",
    "QuotaConfig",
    "RuleConfig",
    "SharedTierConfig",
    "StateConfig",
    "TierConfig",
    "TomlLocator",
    "WriteConfig",
    "check_file",
    "load_config",
    "load_policy",
    "parse_backing_url",
]
