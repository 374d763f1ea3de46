"""LocalStore: the ObjectStore protocol over a local directory (``file:///dir``).

It stands in for a bucket in tests and small setups, and behaves like S3
wherever the two can agree.

Layout (``R`` is the root directory):

- the object ``a/b/c`` is the regular file ``R/a/b/c``; "directories" are
  implied by ``/`` exactly as in S3;
- the marker object ``a/b/`` (a key ending in ``/``) is the file
  ``R/a/b/.tierfs-dirmarker``; it lists as the key ``a/b/``;
- user metadata and the ETag of an object live in a JSON sidecar
  ``<dir>/.tierfs-meta/<name>`` next to it, together with a fingerprint of
  the data file (inode, size, mtime in ns).  A sidecar whose fingerprint does
  not match its data file (the file was changed by another tool, or a crash
  hit between the two renames) is ignored: the object then has no metadata,
  like an object overwritten by another S3 client;
- temporary files live in ``R/.tierfs-tmp/``: ``w.*`` for a ``put`` (and
  every sidecar), ``mpu.<id>`` plus a manifest ``mpu.<id>.json`` (key,
  initiation time) for a ``put_multipart`` or multipart ``copy``.  These are
  this store's "multipart uploads": ``list_uploads`` lists them and
  ``abort_upload`` removes them, so the cleanup that aborts stale S3 uploads
  also removes temp files a crash left here (see ``list_uploads``).

Every name starting with ``.tierfs-`` is reserved: never listed, and refused
as a key segment, except ``SHADOW_ROOT`` (``.tierfs-attrs``) as the FIRST
segment of a key: the attribute shadow of the layers above lives there (it
is still not listed at the root).  Symlinks, sockets and names that are not valid UTF-8 are
not objects: listings skip them and ``head`` reports ObjectNotFound.

ETag: the hex MD5 of the content for objects written through this class
(the same value S3 gives a single PUT), recorded in the sidecar at write
time.  For a file with no valid sidecar it is ``blake2b-128`` of
``inode:size:mtime_ns`` in hex: stable while the file is unchanged, different
after any rewrite, and cheap for big files written by other tools.

Invariants:

- Keys are validated before they become paths: no empty, ``.`` or ``..``
  segment, no NUL, no reserved name, segments of at most 255 bytes.  Paths
  are built from the validated segments only, the final component is opened
  with ``O_NOFOLLOW`` and the resolved parent must lie inside the root, so no
  key can reach outside the root (not even through a symlink placed there).
- Writes are atomic: data and sidecar are written and fsynced as temp files,
  then renamed into place (sidecar first, data last) and the directories
  fsynced.  A reader sees the old object or the new one, never a mix.
- A directory appears as a common prefix only if some object exists below it
  (found by an early-exit search, not a walk of the tree).  ``delete`` removes
  directories it leaves empty, so the search normally stops at the first
  entry.
- Directory creation/renames (put) and unlink/pruning (delete) run under one
  in-process lock, so a delete never removes a directory a concurrent put is
  about to fill.  Concurrent writers in *other processes* are not
  coordinated.
- A local directory cannot hold both the object ``a`` and objects under
  ``a/`` (S3 can): such a put fails with a StoreError (ENOTDIR / EISDIR).
- ``list_pages`` reads the names of ONE directory, sorts them by UTF-8 bytes
  (a subdirectory ``x`` sorts as ``x/``, as its common prefix does in S3) and
  stats entries page by page.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tierfs.errors import (
    BucketNotFound,
    InvalidArgument,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
)
from tierfs.store.base import (
    RESERVED_ROOTS,
    Bufs,
    CopyJob,
    ListPage,
    Match,
    ObjectInfo,
    ObjectStore,
    ObjectVersion,
    PartsUpload,
    Stop,
    UploadInfo,
    metadata_mtime,
    validate_metadata,
)
from tierfs.store.multipart import (
    Part,
    UploadCancelled,
    md5_digest,
    multipart_etag,
    plan_parts,
    read_exact,
    resolve_part_size,
    run_bounded,
)

log = logging.getLogger(__name__)

RESERVED_PREFIX = ".tierfs-"
MARKER_NAME = ".tierfs-dirmarker"
META_DIR = ".tierfs-meta"
TMP_DIR = ".tierfs-tmp"
UPLOAD_PREFIX = "mpu."
MANIFEST_SUFFIX = ".json"
COPY_CHUNK = 1 << 20
DEFAULT_UPLOAD_WORKERS = 8
NAME_MAX = 255
SIDECAR_VERSION = 1

_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def parse_file_url(url: str) -> Path:
    """``file:///srv/bucket`` -> ``Path("/srv/bucket")``.  InvalidArgument otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        raise InvalidArgument(f"not a file:// URL: {url!r}")
    if parts.netloc not in ("", "localhost"):
        raise InvalidArgument(
            f"file URL must be file:///absolute/path (got host {parts.netloc!r}): {url!r}"
        )
    if parts.query or parts.fragment:
        raise InvalidArgument(f"file URL may not have a query or fragment: {url!r}")
    path = unquote(parts.path)
    if not path.startswith("/") or "\0" in path:
        raise InvalidArgument(f"file URL must name an absolute path: {url!r}")
    return Path(os.path.normpath(path))


def _fingerprint(st: os.stat_result) -> dict[str, int]:
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stat_etag(st: os.stat_result) -> str:
    raw = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _valid_name(name: str) -> bool:
    """A directory entry that can be part of a key (UTF-8, not reserved)."""
    if name.startswith(RESERVED_PREFIX):
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes surface as lone surrogates
        return False
    return True


class LocalStore(ObjectStore):
    """ObjectStore over a local directory.  Thread-safe within one process."""

    url: str

    def __init__(
        self, url: str, *, fsync: bool = True, upload_workers: int = DEFAULT_UPLOAD_WORKERS
    ) -> None:
        self.root = parse_file_url(url)
        self.url = self.root.as_uri()
        self.fsync = fsync
        if upload_workers < 1:
            raise InvalidArgument("upload_workers must be >= 1")
        self.upload_workers = upload_workers
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalStore({self.url!r})"

    def close(self) -> None:
        """Stop the part workers, if any were started."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    # --- keys and paths ----------------------------------------------------------

    def _segments(self, key: str, *, what: str = "key") -> list[str]:
        if not isinstance(key, str):
            raise InvalidArgument(f"{what} must be str, got {type(key).__name__}")
        body = key[:-1] if key.endswith("/") else key
        segments = body.split("/")
        for index, seg in enumerate(segments):
            if seg in ("", ".", ".."):
                raise InvalidArgument(f"{what} {key!r}: empty, '.' or '..' segment")
            if "\0" in seg:
                raise InvalidArgument(f"{what} {key!r}: contains NUL")
            if seg.startswith(RESERVED_PREFIX) and not (index == 0 and seg in RESERVED_ROOTS):
                raise InvalidArgument(
                    f"{what} {key!r}: names starting with {RESERVED_PREFIX!r} are reserved"
                )
            try:
                encoded = seg.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgument(f"{what} {key!r}: not valid UTF-8") from None
            if len(encoded) > NAME_MAX:
                raise InvalidArgument(f"{what} {key!r}: segment longer than {NAME_MAX} bytes")
        return segments

    def _paths(self, key: str) -> tuple[Path, Path]:
        """(data file, sidecar file) for ``key``; raises InvalidArgument for bad keys."""
        if not key:
            raise InvalidArgument("empty key")
        segments = self._segments(key)
        path = self.root.joinpath(*segments)
        if key.endswith("/"):
            path = path / MARKER_NAME
        return path, path.parent / META_DIR / path.name

    def _check_inside(self, path: Path) -> None:
        """The resolved parent of ``path`` must be the root or below it."""
        root = os.path.realpath(self.root)
        parent = os.path.realpath(path.parent)
        if parent != root and not parent.startswith(root + os.sep):
            raise InvalidArgument(f"{path} resolves outside the store root")

    # --- errors --------------------------------------------------------------------

    def _map_os_error(self, exc: OSError, op: str, key: str) -> StoreError:
        """THE mapping from OSError to StoreError for this store."""
        where = f"{self.url}/{key}" if key else self.url
        if not self.root.is_dir():
            return BucketNotFound(f"local store directory '{self.root}' does not exist")
        if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError) or (
            exc.errno == errno.ELOOP
        ):
            return ObjectNotFound(f"{op} {where}: no such key")
        if isinstance(exc, PermissionError):
            return StoreAccessDenied(f"{op} {where}: permission denied ({exc.strerror})")
        return StoreError(
            f"{op} {where}: {exc.strerror or type(exc).__name__}", errno=exc.errno or errno.EIO
        )

    # --- sidecars ---------------------------------------------------------------------

    def _read_sidecar(self, sidecar: Path, st: os.stat_result) -> tuple[str, dict[str, str]]:
        """(etag, metadata) for a data file with stat ``st``."""
        try:
            with open(sidecar, "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError):
            return _stat_etag(st), {}
        if (
            isinstance(doc, dict)
            and doc.get("v") == SIDECAR_VERSION
            and doc.get("fingerprint") == _fingerprint(st)
            and isinstance(doc.get("etag"), str)
            and isinstance(doc.get("metadata"), dict)
        ):
            return doc["etag"], {str(k): str(v) for k, v in doc["metadata"].items()}
        return _stat_etag(st), {}

    def _open_object(self, op: str, key: str) -> tuple[int, os.stat_result, Path]:
        """Open the data file of ``key`` read-only; (fd, stat, sidecar path)."""
        path, sidecar = self._paths(key)
        try:
            self._check_inside(path)
            fd = os.open(path, _O_READ)
        except OSError as exc:
            raise self._map_os_error(exc, op, key) from exc
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise self._map_os_error(exc, op, key) from exc
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ObjectNotFound(f"{op} {self.url}/{key}: no such key")
        return fd, st, sidecar

    # --- ObjectStore -------------------------------------------------------------------

    def check(self) -> None:
        if not self.root.is_dir():
            raise BucketNotFound(f"local store directory '{self.root}' does not exist")
        if not os.access(self.root, os.R_OK | os.W_OK | os.X_OK):
            raise StoreAccessDenied(
                f"local store directory '{self.root}' is not readable and writable"
            )

    def reserved(self, key: str) -> bool:
        segments = (key[:-1] if key.endswith("/") else key).split("/")
        return any(
            seg.startswith(RESERVED_PREFIX) and not (index == 0 and seg in RESERVED_ROOTS)
            for index, seg in enumerate(segments)
        )

    def key_fits(self, key: str) -> bool:
        try:
            self._paths(key)
        except InvalidArgument:
            return False
        return len(os.fsencode(self.root)) + len(key.encode()) + len(MARKER_NAME) + 2 < 4096

    def list_pages(self, prefix: str, page_size: int = 1000) -> Iterator[ListPage]:
        """Delimited listing of one directory.  An empty listing yields no pages."""
        if prefix and not prefix.endswith("/"):
            raise InvalidArgument(f"list prefix must be '' or end in '/': {prefix!r}")
        if page_size < 1:
            raise InvalidArgument(f"page_size must be >= 1, got {page_size}")
        dirpath = (
            self.root.joinpath(*self._segments(prefix, what="prefix")) if prefix else self.root
        )
        try:
            self._check_inside(dirpath / "x")
            with os.scandir(dirpath) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            if not self.root.is_dir():
                raise BucketNotFound(
                    f"local store directory '{self.root}' does not exist"
                ) from None
            return
        except OSError as exc:
            raise self._map_os_error(exc, "list", prefix) from exc

        ranked: list[tuple[bytes, os.DirEntry[str]]] = []
        for entry in entries:
            name = entry.name
            if name == MARKER_NAME:
                ranked.append((b"", entry))
            elif _valid_name(name):
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                ranked.append((name.encode("utf-8") + (b"/" if is_dir else b""), entry))
        ranked.sort(key=lambda item: item[0])
        del entries

        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        for rank, entry in ranked:
            try:
                if rank.endswith(b"/"):
                    if not _has_objects(entry.path):
                        continue
                    prefixes.append(prefix + entry.name + "/")
                else:
                    st = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    sidecar = Path(dirpath, META_DIR, entry.name)
                    etag, _ = self._read_sidecar(sidecar, st)
                    key = prefix if entry.name == MARKER_NAME else prefix + entry.name
                    objects.append(
                        ObjectInfo(key=key, size=st.st_size, etag=etag, mtime=st.st_mtime)
                    )
            except FileNotFoundError:
                continue  # removed while we listed
            if len(objects) + len(prefixes) >= page_size:
                yield ListPage(objects=objects, prefixes=prefixes)
                objects, prefixes = [], []
        if objects or prefixes:
            yield ListPage(objects=objects, prefixes=prefixes)

    def head(self, key: str) -> ObjectInfo:
        fd, st, sidecar = self._open_object("head", key)
        os.close(fd)
        etag, metadata = self._read_sidecar(sidecar, st)
        return ObjectInfo(
            key=key,
            size=st.st_size,
            etag=etag,
            mtime=metadata_mtime(metadata, st.st_mtime),
            metadata=metadata,
        )

    def _open_range(self, key: str, match: Match) -> tuple[int, os.stat_result]:
        """Open the object for a ranged read, after checking ``match.etag``
        (If-Match).  This store keeps no versions: a version is refused."""
        if match.version:
            raise InvalidArgument(
                f"get_range {self.url}/{key}: this store keeps no versions "
                f"(asked for version {match.version!r})"
            )
        fd, st, sidecar = self._open_object("get_range", key)
        try:
            if match.etag:
                current, _ = self._read_sidecar(sidecar, st)
                if current != match.etag.strip().strip('"'):
                    raise PreconditionFailed(
                        f"get_range {self.url}/{key}: object changed (ETag no longer matches)"
                    )
        except OSError as exc:
            os.close(fd)
            raise self._map_os_error(exc, "get_range", key) from exc
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def get_range(
        self,
        key: str,
        start: int,
        length: int,
        etag: str | None = None,
        *,
        version: str | None = None,
    ) -> bytes:
        if start < 0 or length < 0:
            raise InvalidArgument(f"get_range {key!r}: negative start or length")
        fd, st = self._open_range(key, Match(etag, version))
        try:
            want = max(0, min(length, st.st_size - start))
            chunks: list[bytes] = []
            got = 0
            while got < want:
                chunk = os.pread(fd, want - got, start + got)
                if not chunk:
                    break  # file shrank under us: return what exists
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise self._map_os_error(exc, "get_range", key) from exc
        finally:
            os.close(fd)

    def _read_into(self, key: str, start: int, bufs: Bufs, match: Match, stop: Stop) -> int:
        fd, st = self._open_range(key, match)
        try:
            want = max(0, min(sum(len(b) for b in bufs), st.st_size - start))
            views = [b for b in bufs if len(b)]
            # With ``stop``, one buffer per read, so that it is asked between buffers.
            batch = 1 if stop is not None else len(views)
            got = 0
            while got < want and views:
                n = os.preadv(fd, views[:batch], start + got)
                if n <= 0:
                    break  # file shrank under us: return what exists
                got += n
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                    if stop is not None and views and got < want and stop():
                        return got
                if n:
                    views[0] = views[0][n:]
            return min(got, want)
        except OSError as exc:
            raise self._map_os_error(exc, "get_range", key) from exc
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        path, sidecar = self._paths(key)
        meta = validate_metadata(metadata)
        payload = bytes(data)
        etag = hashlib.md5(payload, usedforsecurity=False).hexdigest()
        tmp_data = None
        try:
            tmp_dir = self._prepare_write(path, sidecar)
            tmp_data = self._write_temp(tmp_dir, payload)
            self._commit("put", key, path, sidecar, tmp_data, etag, meta)
            tmp_data = None
        except OSError as exc:
            raise self._map_os_error(exc, "put", key) from exc
        finally:
            if tmp_data is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_data)
        return etag

    def delete(self, key: str) -> None:
        path, sidecar = self._paths(key)
        try:
            self._check_inside(path)
            self._check_inside(sidecar)
        except OSError as exc:
            raise self._map_os_error(exc, "delete", key) from exc
        with self._lock:
            try:
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode):
                    return  # a directory is not an object
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as exc:
                raise self._map_os_error(exc, "delete", key) from exc
            with contextlib.suppress(OSError):
                os.unlink(sidecar)
            self._prune(path.parent)

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete each key (all validated first); missing keys are fine."""
        checked = list(keys)
        for key in checked:
            self._paths(key)
        for key in checked:
            self.delete(key)

    # --- write path: multipart, copy, uploads ----------------------------------------

    def _put_parts(self, job: PartsUpload) -> str:
        """The multipart upload of :meth:`tierfs.store.base.ObjectStore.put_multipart`.

        Parts are written with ``pwrite`` into one upload temp file, at most
        ``concurrency`` at a time on the store's worker threads, then the file
        is fsynced and renamed into place like a ``put``.  The ETag is the
        one S3 would give the same parts (``md5(md5s)-N``).
        """
        key, parts, read_part, meta = job.key, job.parts, job.read_part, job.metadata
        path, sidecar = self._paths(key)
        concurrency, on_upload_id = job.concurrency, job.on_upload_id
        executor = self._executor()
        upload_id, tmp = self._begin_upload("put_multipart", key, path, sidecar)
        # Only our own file operations are mapped to StoreError: an OSError
        # raised by read_part (it reads cache files) must reach the caller as is.
        try:
            if on_upload_id is not None:
                on_upload_id(upload_id)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                raise self._aborted("put_multipart", key, upload_id) from None
            except OSError as exc:
                raise self._map_os_error(exc, "put_multipart", key) from exc
            try:
                stop = threading.Event()

                def write(part: Part) -> bytes:
                    if stop.is_set():
                        raise UploadCancelled
                    data = read_exact(read_part, part)
                    try:
                        _pwrite_all(fd, data, part.offset)
                    except OSError as exc:
                        raise self._map_os_error(exc, "put_multipart", key) from exc
                    return md5_digest(data)

                try:
                    digests = run_bounded(executor, parts, write, concurrency, stop)
                except UploadCancelled as exc:
                    raise StoreError(
                        f"put_multipart {self.url}/{key}: upload stopped because the store "
                        "was closed"
                    ) from exc
                etag = multipart_etag(digests)
                try:
                    if self.fsync:
                        os.fsync(fd)
                    self._finish_upload(
                        "put_multipart", key, upload_id, path, sidecar, tmp, etag, meta
                    )
                except OSError as exc:
                    raise self._map_os_error(exc, "put_multipart", key) from exc
            finally:
                os.close(fd)
            return etag
        finally:
            self._end_upload(upload_id)

    def _copy(self, job: CopyJob) -> str:
        """The copy of :meth:`tierfs.store.base.ObjectStore.copy`.

        A sequential read of the source into a temp file, renamed into place
        like a ``put``.  The ETag is what S3 gives: the MD5 of the content for
        a plain copy, ``md5(part md5s)-N`` for a source above
        ``multipart_threshold`` (then an upload id exists, as on S3, and is
        handed to ``on_upload_id``).  A source rewritten during the copy
        raises PreconditionFailed, like S3's ``x-amz-copy-source-if-match``.
        """
        src_key, dst_key, meta = job.src_key, job.dst_key, job.metadata
        dst_path, dst_sidecar = self._paths(dst_key)
        self._paths(src_key)
        fd, st, src_sidecar = self._open_object("copy", src_key)
        upload_id: str | None = None
        tmp: str | Path | None = None
        try:
            _, src_meta = self._read_sidecar(src_sidecar, st)
            size = st.st_size
            if size > job.multipart_threshold:
                parts = plan_parts(size, resolve_part_size(size, job.part_size))
                upload_id, tmp = self._begin_upload("copy", dst_key, dst_path, dst_sidecar)
                if job.on_upload_id is not None:
                    job.on_upload_id(upload_id)
            else:
                parts = [Part(1, 0, size)]
                tmp_dir = self._prepare_write(dst_path, dst_sidecar)
                tmp_fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix="w.")
                os.close(tmp_fd)
            digests = self._copy_parts(fd, tmp, parts)
            if os.fstat(fd).st_mtime_ns != st.st_mtime_ns or os.fstat(fd).st_size != size:
                raise PreconditionFailed(
                    f"copy {self.url}/{src_key}: source changed during the copy"
                )
            new_meta = src_meta if meta is None else meta
            if upload_id is not None:
                etag = multipart_etag(digests)
                self._finish_upload(
                    "copy", dst_key, upload_id, dst_path, dst_sidecar, tmp, etag, new_meta
                )
            else:
                etag = digests[0].hex()
                self._commit("copy", dst_key, dst_path, dst_sidecar, tmp, etag, new_meta)
            tmp = None
            return etag
        except OSError as exc:
            if upload_id is not None and tmp is not None and not os.path.exists(tmp):
                raise self._aborted("copy", dst_key, upload_id) from None
            raise self._map_os_error(exc, "copy", dst_key) from exc
        finally:
            os.close(fd)
            if upload_id is not None:
                self._end_upload(upload_id)
            elif tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def versioning(self) -> bool:
        return False  # a directory keeps one version of each file

    def current_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        return iter(())

    def versions(self, prefix: str) -> Iterator[ObjectVersion]:
        return iter(())

    def list_uploads(self, prefix: str = "") -> list[UploadInfo]:
        """The local equivalent of ListMultipartUploads: unfinished temp files.

        Every ``put_multipart`` (and multipart ``copy``) in progress has a
        manifest ``.tierfs-tmp/mpu.<id>.json`` naming its key: it is listed
        with that key.  Temp files nobody will finish (left by a crash: single
        ``put`` temp files, data files whose manifest is gone, unreadable
        manifests) are listed with ``key=""`` and ``upload_id`` = their file
        name, and only when ``prefix`` is ``""``.  ``initiated`` is the
        manifest's time or the file's mtime.  So the same cleanup that
        aborts stale S3 uploads (``abort_stale_uploads(store, mount_time)``)
        removes this store's stale temp files.  Temp files of uploads running
        right now in this process are listed too: abort only older ones.
        """
        if not isinstance(prefix, str):
            raise InvalidArgument(f"prefix must be str, got {type(prefix).__name__}")
        if not self.root.is_dir():
            raise BucketNotFound(f"local store directory '{self.root}' does not exist")
        tmp_dir = self.root / TMP_DIR
        try:
            with os.scandir(tmp_dir) as it:
                entries = list(it)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._map_os_error(exc, "list_uploads", "") from exc
        uploads: list[UploadInfo] = []
        manifests: set[str] = set()
        for entry in entries:
            upload_id = _manifest_id(entry.name)
            if upload_id is None:
                continue
            doc = _read_manifest(tmp_dir / entry.name)
            if doc is None:
                continue
            manifests.add(upload_id)
            if doc[0].startswith(prefix):
                uploads.append(UploadInfo(key=doc[0], upload_id=upload_id, initiated=doc[1]))
        if prefix == "":
            for entry in entries:
                name = entry.name
                if name.startswith(UPLOAD_PREFIX) and (
                    name[len(UPLOAD_PREFIX) :] in manifests or _manifest_id(name) in manifests
                ):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                uploads.append(UploadInfo(key="", upload_id=name, initiated=st.st_mtime))
        uploads.sort(key=lambda u: (u.key.encode(), u.initiated, u.upload_id))
        return uploads

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Remove an upload's temp files (see ``list_uploads``); unknown ids are fine.

        ``key`` must match the upload's manifest, as S3 wants the key of an
        upload; leftover temp files without a manifest are removed with
        ``key=""``.  Aborting an upload that is still running makes it fail.
        """
        if (
            not isinstance(upload_id, str)
            or not upload_id
            or "/" in upload_id
            or "\0" in upload_id
            or upload_id.startswith(".")
        ):
            raise InvalidArgument(f"bad upload id: {upload_id!r}")
        if not isinstance(key, str):
            raise InvalidArgument(f"key must be str, got {type(key).__name__}")
        tmp_dir = self.root / TMP_DIR
        manifest = tmp_dir / f"{UPLOAD_PREFIX}{upload_id}{MANIFEST_SUFFIX}"
        doc = _read_manifest(manifest)
        if doc is not None:
            if doc[0] == key:
                self._end_upload(upload_id)
            return
        if key == "":
            leftover = tmp_dir / upload_id
            try:
                if stat.S_ISREG(os.lstat(leftover).st_mode):
                    os.unlink(leftover)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._map_os_error(exc, "abort_upload", key) from exc

    # --- upload helpers ------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.upload_workers, thread_name_prefix="tierfs-local-part"
                )
            return self._pool

    def _begin_upload(self, op: str, key: str, path: Path, sidecar: Path) -> tuple[str, Path]:
        """Create the manifest and the empty data temp file of a new upload."""
        upload_id = uuid.uuid4().hex
        try:
            tmp_dir = self._prepare_write(path, sidecar)
            manifest = tmp_dir / f"{UPLOAD_PREFIX}{upload_id}{MANIFEST_SUFFIX}"
            doc = {"v": SIDECAR_VERSION, "key": key, "initiated": time.time()}
            fd = os.open(manifest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                _pwrite_all(fd, json.dumps(doc, sort_keys=True).encode(), 0)
            finally:
                os.close(fd)
            data = tmp_dir / f"{UPLOAD_PREFIX}{upload_id}"
            os.close(os.open(data, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            self._end_upload(upload_id)
            raise self._map_os_error(exc, op, key) from exc
        return upload_id, data

    def _finish_upload(
        self,
        op: str,
        key: str,
        upload_id: str,
        path: Path,
        sidecar: Path,
        tmp: str | Path,
        etag: str,
        meta: dict[str, str],
    ) -> None:
        """Commit an upload's data file unless the upload was aborted meanwhile."""
        manifest = self.root / TMP_DIR / f"{UPLOAD_PREFIX}{upload_id}{MANIFEST_SUFFIX}"
        if not manifest.exists() or not os.path.exists(tmp):
            raise self._aborted(op, key, upload_id)
        self._commit(op, key, path, sidecar, tmp, etag, meta)

    def _aborted(self, op: str, key: str, upload_id: str) -> StoreError:
        return StoreError(f"{op} {self.url}/{key}: upload {upload_id} was aborted meanwhile")

    def _end_upload(self, upload_id: str) -> None:
        """Remove an upload's temp files (data first, then its manifest)."""
        tmp_dir = self.root / TMP_DIR
        for name in (f"{UPLOAD_PREFIX}{upload_id}", f"{UPLOAD_PREFIX}{upload_id}{MANIFEST_SUFFIX}"):
            with contextlib.suppress(OSError):
                os.unlink(tmp_dir / name)

    def _copy_parts(self, src_fd: int, tmp: str | Path, parts: list[Part]) -> list[bytes]:
        """Copy the parts' bytes from ``src_fd`` into ``tmp``; MD5 digest per part."""
        digests: list[bytes] = []
        out = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for part in parts:
                md5 = hashlib.md5(usedforsecurity=False)
                pos = part.offset
                while pos < part.end:
                    chunk = os.pread(src_fd, min(COPY_CHUNK, part.end - pos), pos)
                    if not chunk:
                        raise PreconditionFailed(f"copy {self.url}: source shrank during the copy")
                    _pwrite_all(out, chunk, pos)
                    md5.update(chunk)
                    pos += len(chunk)
                digests.append(md5.digest())
            if self.fsync:
                os.fsync(out)
        finally:
            os.close(out)
        return digests

    # --- write helpers ---------------------------------------------------------------

    def _prepare_write(self, path: Path, sidecar: Path) -> Path:
        """Checks before writing ``path``; returns the temp directory (created if needed)."""
        self._check_inside(path)
        self._check_inside(sidecar)  # a planted .tierfs-meta symlink must not escape either
        if not self.root.is_dir():
            raise BucketNotFound(f"local store directory '{self.root}' does not exist")
        tmp_dir = self.root / TMP_DIR
        tmp_dir.mkdir(mode=0o700, exist_ok=True)
        return tmp_dir

    def _commit(
        self,
        op: str,
        key: str,
        path: Path,
        sidecar: Path,
        tmp_data: str | Path,
        etag: str,
        meta: dict[str, str],
    ) -> None:
        """Move the finished (fsynced) temp file ``tmp_data`` into place as ``key``.

        Writes the sidecar as a temp file, then renames sidecar first and data
        last under the lock, and fsyncs both directories.  Raises OSError (the
        caller maps it) or StoreError.  On success ``tmp_data`` is gone.
        """
        tmp_dir = self.root / TMP_DIR
        st = os.stat(tmp_data)
        doc = {
            "v": SIDECAR_VERSION,
            "etag": etag,
            "metadata": meta,
            "fingerprint": _fingerprint(st),
        }
        tmp_side = self._write_temp(tmp_dir, json.dumps(doc, sort_keys=True).encode())
        placed = False
        try:
            with self._lock:
                self._make_parent(path, key, op)
                sidecar.parent.mkdir(exist_ok=True)
                os.replace(tmp_side, sidecar)
                placed = True
                try:
                    os.replace(tmp_data, path)
                except IsADirectoryError:
                    raise StoreError(
                        f"{op} {self.url}/{key}: a directory of that name holds other objects; "
                        "a local store cannot have both 'x' and 'x/...'",
                        errno=errno.EISDIR,
                    ) from None
                if self.fsync:
                    _fsync_dir(sidecar.parent)
                    _fsync_dir(path.parent)
        finally:
            if not placed:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_side)

    def _write_temp(self, tmp_dir: Path, payload: bytes) -> str:
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="w.")
        try:
            view = memoryview(payload)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
        os.close(fd)
        return name

    def _make_parent(self, path: Path, key: str, op: str = "put") -> None:
        """Create the directories above ``path`` (caller holds the lock)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(
                f"{op} {self.url}/{key}: a parent of this key is an object; "
                "a local store cannot have both 'x' and 'x/...'",
                errno=errno.ENOTDIR,
            ) from None
        if path.name != MARKER_NAME and path.is_dir() and not path.is_symlink():
            # An empty leftover directory may be replaced by the file.
            self._remove_if_empty(path)

    def _prune(self, directory: Path) -> None:
        """Remove ``directory`` and its parents while they are empty (lock held)."""
        current = directory
        while current != self.root and self.root in current.parents:
            if not self._remove_if_empty(current):
                return
            current = current.parent

    def _remove_if_empty(self, directory: Path) -> bool:
        """Remove ``directory`` if it holds no object (lock held): its
        sidecars whose object is gone go first.  Another tool may delete an
        object's file and leave its sidecar (``rm`` in the directory), and
        such a leftover must not keep a name from becoming a file."""
        meta = directory / META_DIR
        with contextlib.suppress(OSError):
            for name in os.listdir(meta):
                if not os.path.lexists(directory / name):
                    with contextlib.suppress(OSError):
                        os.unlink(meta / name)
            os.rmdir(meta)
        try:
            os.rmdir(directory)
        except OSError:
            return False
        return True


def _has_objects(top: str) -> bool:
    """True if some object (regular file or marker) lies below ``top``.

    Depth-first with an early exit: stops at the first object found.
    """
    stack = [top]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    name = entry.name
                    if name != MARKER_NAME and not _valid_name(name):
                        continue
                    try:
                        if entry.is_file(follow_symlinks=False):
                            return True
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return False


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _manifest_id(name: str) -> str | None:
    """The upload id of a manifest file name ``mpu.<id>.json``, else None."""
    if name.startswith(UPLOAD_PREFIX) and name.endswith(MANIFEST_SUFFIX):
        upload_id = name[len(UPLOAD_PREFIX) : -len(MANIFEST_SUFFIX)]
        return upload_id or None
    return None


def _read_manifest(path: Path) -> tuple[str, float] | None:
    """(key, initiated) from an upload manifest, or None if missing or unreadable."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if (
        isinstance(doc, dict)
        and doc.get("v") == SIDECAR_VERSION
        and isinstance(doc.get("key"), str)
        and isinstance(doc.get("initiated"), int | float)
    ):
        return doc["key"], float(doc["initiated"])
    return None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
