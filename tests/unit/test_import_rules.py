"""Enforce the layer and import rules (docs/design.md, "Layers").

Every ``.py`` file under ``tierfs/`` and ``daemon/tierfsd/`` is parsed with
``ast`` (nothing is imported, so a broken module cannot hide a violation).
Counted as imports: ``import x``, ``from x import y`` (relative ones resolved
against the file's package), and ``importlib.import_module("x")`` /
``__import__("x")`` with a literal name. Imports under ``if TYPE_CHECKING:``
count too: the layering is about who may depend on whom, not only about what
runs.

Rules:

- ``pyfuse3`` only under ``daemon/tierfsd/``;
- ``boto3`` / ``botocore`` / ``s3transfer`` / ``obstore`` only under ``tierfs/store/``;
- ``lmdb`` only under ``tierfs/meta/``;
- ``tierfs/policy/`` is pure and synchronous: it must not reach trio, asyncio,
  boto3, botocore, s3transfer, obstore, lmdb, pyfuse3, socket or subprocess, directly
  or through any tierfs module it imports (importing ``a.b.c`` runs
  ``a/__init__``, ``a/b/__init__`` and ``a/b/c``, and the check follows that);
- nothing under ``tierfs/`` imports ``tierfsd`` (or ``daemon``);
- ``tierfs/core/`` does not import ``tierfs.control`` or ``tierfs.cli``;
- inside ``tierfs/core/``, the subpackages depend one way, in the order
  ``state`` -> ``names`` -> ``read`` -> ``tiering`` -> ``write``: a module of
  one imports only its own subpackage and those before it, and never core's
  top-level modules (``fs``, ``reports``, ``upkeep``), which compose them;
- ``daemon/`` has no ``__init__.py``.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# "tierfs/x.py" is module "tierfs.x"; "daemon/tierfsd/x.py" is "tierfsd.x".
SOURCE_DIRS = ("tierfs", "daemon/tierfsd")
PROJECT_TOPS = {"tierfs", "tierfsd"}

ONLY_UNDER = {
    "pyfuse3": "daemon/tierfsd/",
    "boto3": "tierfs/store/",
    "botocore": "tierfs/store/",
    "s3transfer": "tierfs/store/",
    "obstore": "tierfs/store/",
    "lmdb": "tierfs/meta/",
}
POLICY_DIR = "tierfs/policy/"
POLICY_FORBIDDEN = frozenset(
    {
        "trio",
        "asyncio",
        "boto3",
        "botocore",
        "s3transfer",
        "obstore",
        "lmdb",
        "pyfuse3",
        "socket",
        "subprocess",
    }
)
CORE_DIR = "tierfs/core/"
CORE_FORBIDDEN = ("tierfs.control", "tierfs.cli")
#: The subpackages of tierfs/core, bottom first: each may import only itself
#: and those before it (docs/design.md, "Inside the core").
CORE_ORDER = ("state", "names", "read", "tiering", "write")


def module_name(relpath: str) -> str:
    """``tierfs/core/read.py`` -> ``tierfs.core.read``; ``__init__.py`` -> its package."""
    path = relpath.removeprefix("daemon/")
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(relpath: str, source: str) -> set[str]:
    """Absolute names of every module (or module attribute) ``source`` imports."""
    tree = ast.parse(source, filename=relpath)
    mod = module_name(relpath)
    package = mod if relpath.endswith("__init__.py") else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 >= len(parts):
                    found.add(f"<relative import beyond top level: level {node.level}>")
                    continue
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from tierfs import control` imports the module tierfs.control.
            found.update(f"{target}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            arg = node.args[0]
            if (
                fname in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
            ):
                found.add(arg.value)
    return found


def direct_violations(relpath: str, imports: set[str]) -> list[str]:
    out = []
    for name in sorted(imports):
        top = name.split(".")[0]
        if name.startswith("<"):
            out.append(f"{relpath}: {name}")
        if top in ONLY_UNDER and not relpath.startswith(ONLY_UNDER[top]):
            out.append(f"{relpath}: imports {name}; only {ONLY_UNDER[top]} may import {top}")
        if relpath.startswith("tierfs/") and top in ("tierfsd", "daemon"):
            out.append(f"{relpath}: imports {name}; the library must not import the daemon")
        if relpath.startswith(CORE_DIR):
            for bad in CORE_FORBIDDEN:
                if _within(name, bad):
                    out.append(f"{relpath}: imports {name}; tierfs/core must not import {bad}")
            problem = core_order_problem(relpath, name)
            if problem:
                out.append(f"{relpath}: imports {name}; {problem}")
    return out


def core_order_problem(relpath: str, name: str) -> str | None:
    """Why a module of a core subpackage may not import ``name`` (None: it may)."""
    inside = relpath.removeprefix(CORE_DIR).split("/")
    if len(inside) < 2 or not _within(name, "tierfs.core"):
        return None  # core's top-level modules compose; other imports: other rules
    sub = inside[0]
    if sub not in CORE_ORDER:
        return f"tierfs/core/{sub}/ is not in the core's order {CORE_ORDER}"
    allowed = CORE_ORDER[: CORE_ORDER.index(sub) + 1]
    target = name.split(".")
    if len(target) >= 3 and target[2] in allowed:
        return None
    if len(target) >= 3 and target[2] in CORE_ORDER:
        return (
            f"core/{sub} may import only {', '.join(allowed)} "
            f"(the core's order is {' -> '.join(CORE_ORDER)})"
        )
    return f"core/{sub} must not import core's top level (fs, reports, upkeep compose the parts)"


def _executed_modules(name: str, modules: Mapping[str, str]) -> list[str]:
    """Project modules that run when ``name`` is imported: each existing prefix."""
    parts = name.split(".")
    prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return [p for p in prefixes if p in modules]


def policy_violations(files: Mapping[str, str], imports: Mapping[str, set[str]]) -> list[str]:
    """Forbidden modules reached from tierfs/policy, following tierfs imports."""
    modules = {module_name(rel): rel for rel in files}  # module -> relpath
    out = []
    for start_rel in sorted(files):
        if not start_rel.startswith(POLICY_DIR):
            continue
        start = module_name(start_rel)
        # BFS over project modules; `via` remembers how each one was reached.
        via: dict[str, str | None] = {}
        queue: deque[str] = deque()
        for m in _executed_modules(start, modules):
            via[m] = None if m == start else start
            queue.append(m)
        while queue:
            cur = queue.popleft()
            for name in sorted(imports[modules[cur]]):
                top = name.split(".")[0]
                if top in POLICY_FORBIDDEN:
                    chain = [cur]
                    while via.get(chain[-1]) is not None:
                        chain.append(via[chain[-1]])
                    path = " <- ".join(chain)
                    out.append(
                        f"{start_rel}: reaches {name} (imported by {path}); "
                        "tierfs/policy must stay pure and synchronous"
                    )
                if top in PROJECT_TOPS:
                    for m in _executed_modules(name, modules):
                        if m not in via:
                            via[m] = cur
                            queue.append(m)
    return out


def check_tree(files: Mapping[str, str]) -> list[str]:
    """All rule violations in ``files`` (repo-relative posix path -> source)."""
    imports: dict[str, set[str]] = {}
    out: list[str] = []
    for rel, source in sorted(files.items()):
        try:
            imports[rel] = imports_of(rel, source)
        except SyntaxError as exc:
            out.append(f"{rel}: cannot parse: {exc}")
            imports[rel] = set()
            continue
        out.extend(direct_violations(rel, imports[rel]))
    out.extend(policy_violations(files, imports))
    return sorted(set(out))


def project_files() -> dict[str, str]:
    files = {}
    for directory in SOURCE_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            files[path.relative_to(REPO).as_posix()] = path.read_text(encoding="utf-8")
    return files


# --- the real tree ------------------------------------------------------------


def test_project_follows_import_rules():
    files = project_files()
    assert any(rel.startswith("tierfs/") for rel in files), "no sources found under tierfs/"
    violations = check_tree(files)
    assert violations == [], "import rule violations:\n" + "\n".join(violations)


def test_daemon_is_not_a_package():
    # `daemon` would shadow python-daemon's import name.
    assert (REPO / "daemon").is_dir()
    assert not (REPO / "daemon" / "__init__.py").exists()


# --- the checker itself must be able to fail ------------------------------------


@pytest.mark.parametrize(
    ("relpath", "source", "expected"),
    [
        ("tierfs/core/read.py", "import boto3\n", "only tierfs/store/ may import boto3"),
        (
            "tierfs/tiers/x.py",
            "from botocore.exceptions import ClientError\n",
            "only tierfs/store/",
        ),
        ("tierfs/store/s3.py", "import lmdb\n", "only tierfs/meta/ may import lmdb"),
        ("tierfs/core/fs.py", "import pyfuse3\n", "only daemon/tierfsd/ may import pyfuse3"),
        ("tierfs/cli.py", "from tierfsd import main\n", "must not import the daemon"),
        ("tierfs/core/fs.py", "from tierfs.control import client\n", "tierfs.control"),
        ("tierfs/core/fs.py", "from tierfs import cli\n", "tierfs.cli"),
        ("tierfs/core/fs.py", "from ..control.client import Client\n", "tierfs.control"),
        ("tierfs/core/fs.py", "from .. import control\n", "tierfs.control"),
        (
            "tierfs/core/fs.py",
            "import importlib\nimportlib.import_module('boto3')\n",
            "only tierfs/store/",
        ),
        (
            "tierfs/core/fs.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lmdb\n",
            "only tierfs/meta/",
        ),
        (
            "tierfs/core/names/inodekeys.py",
            "from ..write.journal import child_key\n",
            "core/names may import only state, names",
        ),
        (
            "tierfs/core/state/openfiles.py",
            "from tierfs.core.read import blockcache\n",
            "core/state may import only state",
        ),
        (
            "tierfs/core/read/handles.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..tiering.space import X\n",
            "core/read may import only state, names, read",
        ),
        ("tierfs/core/read/handles.py", "from ..fs import TierFS\n", "core's top level"),
        ("tierfs/core/write/sync.py", "from tierfs.core import TierFS\n", "core's top level"),
        ("tierfs/core/extra/x.py", "from ..state import journal\n", "not in the core's order"),
        ("tierfs/policy/rules.py", "import trio\n", "pure and synchronous"),
        ("tierfs/policy/rules.py", "import subprocess\n", "pure and synchronous"),
        ("tierfs/policy/rules.py", "from socket import socket\n", "pure and synchronous"),
    ],
)
def test_checker_catches(relpath, source, expected):
    violations = check_tree({relpath: source})
    assert any(expected in v for v in violations), violations


def test_checker_follows_policy_imports_transitively():
    files = {
        "tierfs/__init__.py": "",
        "tierfs/policy/__init__.py": "",
        "tierfs/policy/victims.py": "from tierfs.meta.records import FileRecord\n",
        "tierfs/meta/__init__.py": "from .db import open_db\n",
        "tierfs/meta/db.py": "import lmdb\n",
        "tierfs/meta/records.py": "",
    }
    violations = check_tree(files)
    assert len(violations) == 1, violations
    assert "tierfs/policy/victims.py: reaches lmdb" in violations[0]
    assert "tierfs.meta.db <- tierfs.meta <- tierfs.policy.victims" in violations[0]


def test_checker_accepts_allowed_imports():
    files = {
        "tierfs/__init__.py": "",
        "tierfs/errors.py": "import errno\n",
        "tierfs/config.py": "import tomllib\nfrom .errors import TierfsError\n",
        "tierfs/meta/db.py": "import lmdb\n",
        "tierfs/store/s3.py": "import boto3\nfrom botocore.config import Config\n",
        "tierfs/policy/rules.py": "import fnmatch\nfrom tierfs.config import RuleConfig\n",
        "tierfs/core/fs.py": "import trio\nfrom tierfs.meta.db import open_db\n",
        "tierfs/core/upkeep.py": "from .write.sync import Sync\nfrom .state import journal\n",
        "tierfs/core/write/sync.py": "from ..state.journal import J\nfrom ..names import x\n",
        "tierfs/core/tiering/movement.py": "from ..read.fetcher import F\nfrom .space import S\n",
        "tierfs/core/state/journal.py": "from .clock import Clock\nfrom tierfs.meta import MetaDB\n",
        "tierfs/control/client.py": "import socket\n",
        "daemon/tierfsd/fuse_ops.py": "import pyfuse3\nfrom tierfs.core.fs import TierFS\n",
    }
    assert check_tree(files) == []


def test_module_names():
    assert module_name("tierfs/core/read.py") == "tierfs.core.read"
    assert module_name("tierfs/core/__init__.py") == "tierfs.core"
    assert module_name("daemon/tierfsd/main.py") == "tierfsd.main"
    assert imports_of("tierfs/core/__init__.py", "from . import read") == {
        "tierfs.core",
        "tierfs.core.read",
    }


def test_python_client_api_needs_none_of_the_daemon_dependencies():
    """``tierfs.client`` is imported by training scripts: importing it (in a
    fresh interpreter) must not load trio, lmdb, boto3, pyfuse3, rich or
    torch (``tierfs.torch`` imports torch; ``tierfs`` does not)."""
    import subprocess
    import sys

    heavy = ("trio", "lmdb", "boto3", "botocore", "pyfuse3", "rich", "xxhash", "obstore", "torch")
    code = f"import sys, tierfs, tierfs.client; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


CLIENT_ONLY = """
import sys
# A client-only install (pip install tierfs): none of the daemon's modules.
for name in sys.argv[1].split(","):
    sys.modules[name] = None
import tierfs.client, tierfs.torch
from tierfs.cli import main
print("check", main(["policy", "check", "--offline", sys.argv[2]]), flush=True)
print("mount", main(["mount", sys.argv[3], sys.argv[4]]), flush=True)
"""


def test_a_client_only_install_imports_the_client_and_torch_and_says_what_mount_needs(
    tmp_path: Path,
) -> None:
    """The base dependencies (``pip install tierfs``, a training image) hold
    none of the daemon's; with none of those modules importable,
    ``tierfs.client``, ``tierfs.torch`` and the CLI's checks work, and
    ``tierfs mount`` names what to install instead of a traceback."""
    import subprocess
    import sys
    import tomllib

    from tierfs.cli import DAEMON_MODULES

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    daemon = " ".join(project["optional-dependencies"]["daemon"])
    for module in DAEMON_MODULES:
        distribution = module.replace("_", "-")
        assert distribution not in base, distribution
        assert distribution in daemon, distribution
    assert "tierfs[daemon,torch]" in project["optional-dependencies"]["test"]

    config = tmp_path / "tierfs.toml"
    (tmp_path / "nvme").mkdir()
    config.write_text(
        f'[backing]\nurl = "file://{tmp_path}/bucket"\n[state]\ndir = "{tmp_path}/state"\n'
        f'[[tiers]]\nname = "nvme"\npath = "{tmp_path}/nvme"\ncapacity = "1GiB"\n'
    )
    (tmp_path / "mnt").mkdir()
    blocked = ",".join((*DAEMON_MODULES, "botocore", "outcome"))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CLIENT_ONLY,
            blocked,
            str(config),
            str(config),
            str(tmp_path / "mnt"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == [
        "ok (offline: tier and state directories and the bucket not checked)",
        "check 0",
        "mount 1",
    ], done.stderr
    assert "pip install 'tierfs[daemon]'" in done.stderr
    assert "pyfuse3" in done.stderr
    assert not (tmp_path / "state").exists()  # nothing was started


def test_workers_take_their_parts_not_the_filesystem() -> None:
    """A worker is given its parts at construction (docs/design.md, "The
    core and its parts"): only ``workers/wiring.py``, which builds them,
    knows ``TierFS``; no worker keeps it (``self.fs``) to reach through."""
    offenders = []
    for path in sorted((REPO / "tierfs" / "workers").glob("*.py")):
        if path.name == "wiring.py":
            continue
        rel = path.relative_to(REPO).as_posix()
        source = path.read_text(encoding="utf-8")
        if "tierfs.core" in imports_of(rel, source) or "tierfs.core.TierFS" in imports_of(
            rel, source
        ):
            offenders.append(f"{rel}: imports tierfs.core (TierFS)")
        if "self.fs." in source or "self.fs =" in source:
            offenders.append(f"{rel}: keeps the filesystem (self.fs)")
    assert not offenders, "\n".join(offenders)


def test_a_client_only_install_checks_a_policy_with_a_pin_on_an_s3_bucket(
    tmp_path: Path,
) -> None:
    """``tierfs policy check`` on a client-only install, of a config with an
    ``s3://`` backing and a ``pin`` rule (as the shipped example has): the
    pin sizes need the S3 engine, so they are not checked, and the check
    says so and why instead of ending in a traceback."""
    import subprocess
    import sys

    from tierfs.cli import DAEMON_MODULES

    (tmp_path / "nvme").mkdir()
    config = tmp_path / "tierfs.toml"
    config.write_text(
        '[backing]\nurl = "s3://some-bucket/data"\n'
        f'[state]\ndir = "{tmp_path}/state"\n'
        f'[[tiers]]\nname = "nvme"\npath = "{tmp_path}/nvme"\ncapacity = "1GiB"\n'
        '[[rules]]\nmatch = "datasets/imagenet/**"\npin = true\n'
    )
    code = (
        "import sys\n"
        "for name in sys.argv[1].split(','):\n"
        "    sys.modules[name] = None\n"
        "from tierfs.cli import main\n"
        "print('check', main(['policy', 'check', sys.argv[2]]), flush=True)\n"
    )
    blocked = ",".join((*DAEMON_MODULES, "botocore", "outcome"))
    done = subprocess.run(
        [sys.executable, "-c", code, blocked, str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines()[-1] == "check 0", (done.stdout, done.stderr)
    said = done.stdout + done.stderr
    assert "pin sizes not checked" in said and "pip install 'tierfs[daemon]'" in said, said
