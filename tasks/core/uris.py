"""Store URIs: ``file://`` + an absolute path, or ``s3://bucket/key``. Pure string work, no I/O, so that
the parameter models and the catalog's paths load without the storage clients."""

from __future__ import annotations

import os
import posixpath
import re

# ``scheme://user:secret@`` — credentials never belong in a URI this project prints or stores.
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the user-info (credentials) of every URI in it removed."""
    return _USERINFO.sub(r"\1", text)


class StorageError(Exception):
    """A storage operation failed; ``str(err)`` starts with the URI (credentials removed)."""

    def __init__(self, uri: str, message: str) -> None:
        super().__init__(redact(uri), redact(message))
        self.uri = redact(uri)
        self.message = redact(message)

    def __str__(self) -> str:
        return f"{self.uri}: {self.message}"


# The folders of the file:// stores this process was given: below one, the local backend refuses a path that
# resolves outside it (through a symbolic link at any level); links that stay inside are followed.
_STORE_ROOTS: set[str] = set()


def store_root(uri: str) -> str:
    """Register ``uri`` (a normalised store URI) as a store root, for :func:`escape_of` to hold; returns it."""
    if uri.startswith("file://"):
        _STORE_ROOTS.add(uri[len("file://") :])
    return uri


def escape_of(path: str) -> tuple[str, str] | None:
    """Where local ``path`` really leads and the store root it leaves, when it lies below a registered root but
    resolves outside it; None when it stays inside (or lies below no root)."""
    for root in tuple(_STORE_ROOTS):
        if path == root or path.startswith(root + "/"):
            real, real_root = os.path.realpath(path), os.path.realpath(root)
            if real != real_root and not real.startswith(real_root + "/"):
                return real, root
    return None


def to_uri(path_or_uri: str) -> str:
    """Return the normalised URI of a local path or a ``file://`` / ``s3://`` URI (no trailing slash)."""
    if "://" not in path_or_uri:
        return "file://" + os.path.abspath(path_or_uri)
    scheme, rest = path_or_uri.split("://", 1)
    if "@" in rest.partition("/")[0]:
        raise StorageError(
            path_or_uri, "credentials do not belong in a URI: use the environment or an Airflow connection"
        )
    if scheme == "file":
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith("/"):
            raise StorageError(path_or_uri, "file URIs need an absolute path: file:///abs/path")
        return "file://" + posixpath.normpath(rest)
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise StorageError(path_or_uri, "S3 URIs need a bucket: s3://bucket/key")
        key = key.rstrip("/")
        return f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    raise StorageError(path_or_uri, f"unsupported scheme '{scheme}'; expected file:// or s3://")


def join(base: str, *parts: str) -> str:
    """Join path segments onto a URI with ``/``; a ``.`` or ``..`` segment is refused, so a joined URI
    never leaves ``base``."""
    segments = [p.strip("/") for p in parts if p.strip("/")]
    joined = "/".join([to_uri(base).rstrip("/"), *segments])
    if any(piece in (".", "..") for segment in segments for piece in segment.split("/")):
        raise StorageError(joined, "'.' and '..' path segments are not allowed")
    return joined


def contained(root: str, uri: str) -> str:
    """``uri`` when it names an object below ``root`` (compared after normalisation; ``.`` or ``..``
    segments are refused), else a :class:`StorageError` naming both. For URIs read from manifests,
    pointers and archives: nothing is read or written outside the store."""
    base, target = to_uri(root).rstrip("/"), to_uri(uri)
    if uri.startswith("s3://") and any(piece in (".", "..") for piece in uri.split("/")[3:]):
        raise StorageError(uri, "'.' and '..' path segments are not allowed")
    if not target.startswith(base + "/"):
        raise StorageError(uri, f"outside the store {base}")
    return target
