"""What a store (and what lies around it) holds, object by object, for tests that must show a command changed
nothing: a local folder walked file by file (hidden temp and lock files included), an S3 bucket listed key by
key with each object's bytes. Also: a local folder copied into a store root on either backend."""

from __future__ import annotations

from pathlib import Path

from botocore.exceptions import ClientError

from tasks.core import storage

Snapshot = dict[str, bytes]


def folder_snapshot(folder: Path) -> Snapshot:
    """Every file below ``folder`` (relative POSIX path -> bytes); empty when the folder does not exist."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def bucket_snapshot(bucket: str) -> Snapshot:
    """Every object of ``bucket`` (key -> bytes), read through the raw client so that nothing is hidden;
    empty when the bucket does not exist."""
    client = storage.s3_client()
    found: Snapshot = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
            raise
    return found


def bucket_names() -> set[str]:
    return {b["Name"] for b in storage.s3_client().list_buckets().get("Buckets", [])}


def split(snapshot: Snapshot, prefix: str) -> tuple[Snapshot, Snapshot]:
    """(the entries below ``prefix``, the others): what a store root holds, and what lies outside it."""
    below = prefix.rstrip("/") + "/"
    inside = {k: v for k, v in snapshot.items() if k.startswith(below)}
    return inside, {k: v for k, v in snapshot.items() if k not in inside}


def changes(before: Snapshot, after: Snapshot) -> dict[str, list[str]]:
    """The names added, removed and altered between two snapshots (empty lists when they are equal)."""
    return {
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
        "altered": sorted(k for k in before.keys() & after.keys() if before[k] != after[k]),
    }


def copy_into(folder: Path, store: str, skip: tuple[str, ...] = ()) -> None:
    """Copy every file below ``folder`` to the same key below the store root ``store`` (file:// or s3://),
    except those whose relative path starts with one of ``skip``."""
    for relative, body in folder_snapshot(folder).items():
        if not relative.startswith(skip):
            storage.write_bytes(storage.join(store, relative), body)
