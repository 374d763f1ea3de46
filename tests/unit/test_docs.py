"""The documents stand alone: every relative link and every file they cite
exists, the README stays short, and no text cites a tracker number instead
of a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tierfs.config import reference

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]

#: ``[text](target)`` outside code; images too.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: A path of this repository in backticks: a top-level folder, then more.
CITED_PATH = re.compile(
    r"`((?:tierfs|daemon|tests|scripts|deploy|systemd|docs)/[A-Za-z0-9_./@-]+)`"
)
#: "issue 12", "issue #12", "issues 13 and 15": a tracker number, not a reason.
TRACKER = re.compile(r"\bissues?[- ]#?\d+", re.IGNORECASE)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    anchors = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#+\s+(.*)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        anchor_missing = anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        if not linked.exists() or anchor_missing:
            broken.append(target)
    assert not broken, f"{doc.name}: links that do not resolve: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_cited_files_exist(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    missing = sorted(
        {
            cited
            for cited in CITED_PATH.findall(text)
            if not any(c in cited for c in "*<") and not (REPO / cited.rstrip("/")).exists()
        }
    )
    assert not missing, f"{doc.name} cites files that do not exist: {missing}"


def test_readme_keys_table_is_the_schema() -> None:
    """The README's table of config keys says what the loader checks."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert reference.rewrite(text) == text, (
        "the README's config keys are stale: run python -m tierfs.config.reference README.md"
    )


def test_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move details to docs/"


def test_no_tracker_numbers() -> None:
    """Code, tests and documents say why, not which ticket."""
    here = Path(__file__).resolve()
    files = [
        *DOCS,
        *(p for top in ("tierfs", "daemon", "tests", "scripts") for p in (REPO / top).rglob("*")),
    ]
    found = []
    for path in files:
        if path == here or not path.is_file() or path.suffix not in {".py", ".md", ".sh", ".toml"}:
            continue
        if any(p.startswith(".") or p == "node_modules" for p in path.relative_to(REPO).parts):
            continue  # installed tools (tests/bench/.node), caches: not ours
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if TRACKER.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "tracker numbers instead of reasons:\n" + "\n".join(found)


#: "`read/fetcher.py`", "`state/journal`": a module named by its place in
#: ``tierfs/core`` or ``tierfs`` (how docs/design.md names the parts).
SHORT_MODULE = re.compile(
    r"`(?:core/)?((?:state|names|read|tiering|write|workers|store|config|policy|meta|control)"
    r"/[a-z_]+)(?:\.py)?`"
)


def test_design_names_modules_that_exist() -> None:
    """docs/design.md names the parts by short paths (``state/journal``,
    ``read/fetcher.py``): each must be a module of ``tierfs/core`` or
    ``tierfs``, so that a move of a module updates the map."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    named = set(SHORT_MODULE.findall(text))
    assert len(named) > 30, named  # the parts table and the walks
    missing = sorted(
        short
        for short in named
        if not (REPO / "tierfs" / "core" / f"{short}.py").exists()
        and not (REPO / "tierfs" / f"{short}.py").exists()
    )
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"


#: A figure with a unit of time, throughput or CPU, or a ratio ("0.83x"):
#: what a measurement reports.  Quoted examples of input ("200MiB/s") are
#: not figures.
FIGURE = re.compile(
    r"(?<![\"'\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?"
    r"(?:ms|us|µs|MB/s|GB/s|MiB/s|GiB/s|files/s|CPU-s|s/GiB)(?![\"'\w])"
    r"|(?<![\w.])\d+\.\d+x\b"
)
LONG_DOCSTRING = 40


def test_long_module_docstrings_state_rules_not_measurements() -> None:
    """A module docstring states invariants and the design; the figures
    behind them live in docs/benchmarks.md, dated, with their commands.  A
    docstring longer than 40 lines may name one figure at most."""
    import ast

    offenders = []
    for path in sorted([*(REPO / "tierfs").rglob("*.py"), *(REPO / "daemon").rglob("*.py")]):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if doc is None or doc.count("\n") + 1 <= LONG_DOCSTRING:
            continue
        figures = FIGURE.findall(doc)
        if len(figures) > 1:
            offenders.append(f"{path.relative_to(REPO)}: {figures[:5]}")
    assert not offenders, "long docstrings that report measurements:\n" + "\n".join(offenders)


def test_the_figure_pattern_finds_measurements_and_not_examples() -> None:
    text = 'took 6.9 ms, 0.5-0.7 CPU-s; 0.83x the GET loop; write "200MiB/s" or "250ms"'
    assert FIGURE.findall(text) == ["6.9 ms", "0.5-0.7 CPU-s", "0.83x"]


def test_each_core_subpackage_names_each_of_its_modules() -> None:
    """A core subpackage's ``__init__`` docstring is the map of its files:
    each module is named there (``changes``), so none is left out of it."""
    import ast

    core = REPO / "tierfs" / "core"
    missing = []
    for init in sorted(core.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        for module in sorted(init.parent.glob("*.py")):
            if module.stem != "__init__" and f"``{module.stem}``" not in doc:
                missing.append(f"{init.parent.name}/{module.name}")
    assert len(list(core.glob("*/__init__.py"))) == 5
    assert not missing, f"modules their subpackage's docstring does not name: {missing}"


def test_troubleshooting_and_permissions_cover_what_users_meet() -> None:
    """The errors a user meets each have a section, and the S3 permissions
    page names every action the stores call and the conditional PUT the
    shared tier's claims rely on."""
    trouble = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    for errno_name in ("ENOTCONN", "EIO", "ENOSPC", "EDQUOT", "EACCES", "EPERM", "ESTALE"):
        assert f"## `{errno_name}`" in trouble or f"`{errno_name}`" in trouble, errno_name
    for sentence in ("not on a tierfs mount", "belongs to", "A preload stays at 0 %"):
        assert sentence in trouble, sentence
    permissions = (REPO / "docs" / "s3-permissions.md").read_text(encoding="utf-8")
    for action in (
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListBucketMultipartUploads",
        "s3:GetBucketVersioning",
        "s3:ListBucketVersions",
        "If-None-Match: *",
    ):
        assert action in permissions, action
    store = (REPO / "tierfs" / "store" / "s3.py").read_text(encoding="utf-8")
    called = set(re.findall(r"client\.([a-z_]+)\(", store))
    # Every S3 call of the backing store maps to an action the page names.
    action_of = {
        "abort_multipart_upload": "s3:AbortMultipartUpload",
        "complete_multipart_upload": "s3:PutObject",
        "copy_object": "s3:PutObject",
        "create_multipart_upload": "s3:PutObject",
        "delete_object": "s3:DeleteObject",
        "delete_objects": "s3:DeleteObject",
        "get_object": "s3:GetObject",
        "head_bucket": "s3:ListBucket",
        "head_object": "s3:GetObject",
        "list_multipart_uploads": "s3:ListBucketMultipartUploads",
        "get_bucket_versioning": "s3:GetBucketVersioning",
        "list_object_versions": "s3:ListBucketVersions",
        "list_objects_v2": "s3:ListBucket",
        "put_object": "s3:PutObject",
        "upload_part": "s3:PutObject",
        "upload_part_copy": "s3:PutObject",
        "close": None,
    }
    assert called <= set(action_of), (
        f"S3 calls with no documented action: {called - set(action_of)}"
    )
