"""The control protocol: JSON lines over a Unix stream socket.

A client sends one request line ``{"op": NAME, "args": {...}}``.  The server
answers with zero or more event lines ``{"event": "progress", ...}`` and then
exactly one final line: ``{"ok": true, "result": ...}`` or ``{"ok": false,
"error": "sentence", "errno": N}``.  One request per connection.

Where the socket lives: as root ``/run/tierfs/<id>/control.sock``, else
``<state dir>/control/control.sock``; the directory is mode 0755 and the
socket 0666: every local user may connect, and what each may do is checked
per request against the peer's credentials (``SO_PEERCRED``).  ``<id>`` is derived from the mount point, so two mounts never
share a socket.  The CLI does not compute this: it reads the path from the
read-only xattr ``user.tierfs.control_socket`` of the mount root.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The longest line the daemon reads (a request, or a chunk of a list).
MAX_LINE = 1 << 20
#: Paths per ``{"paths": [...]}`` line of a preload list the CLI streams
#: after its request line (then ``{"end": true}``) ...
PRELOAD_LIST_CHUNK = 1000
#: ... and at most about this many bytes of them (JSON-escaped), well
#: under ``MAX_LINE`` whatever the paths hold.
LIST_CHUNK_BYTES = 256 * 1024
CONTROL_XATTR = "user.tierfs.control_socket"


def socket_path_for(mountpoint: Path, state_dir: Path) -> Path:
    ident = hashlib.sha256(str(mountpoint.resolve()).encode()).hexdigest()[:16]
    if os.geteuid() == 0:
        return Path("/run/tierfs") / ident / "control.sock"
    return state_dir / "control" / "control.sock"


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("control message is not a JSON object")
    return message


def list_chunks(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """A list of paths as the messages that stream it to the daemon: chunks
    of ``PRELOAD_LIST_CHUNK`` paths, then the end."""
    chunk: list[str] = []
    size = 0
    for path in lines:
        chunk.append(path)
        # A path's JSON text is at most 12 bytes per character (two \\uXXXX).
        size += 12 * len(path) + 3
        if len(chunk) >= PRELOAD_LIST_CHUNK or size >= LIST_CHUNK_BYTES:
            yield {"paths": chunk}
            chunk = []
            size = 0
    if chunk:
        yield {"paths": chunk}
    yield {"end": True}
