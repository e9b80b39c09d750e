"""Bad input as a user types it, through the ``hpd`` entry point, on a ``file://`` store and, where it applies,
on an S3 store (a bucket on the test suite's moto server on 127.0.0.1): exit 2 for bad parameters and 1 for
bad input, a message naming the input or parameter, no Python traceback, no credentials echoed, the store
unchanged (every object, byte for byte) and nothing written outside it.

One table, every item of the trust layer: containment (run names, manifest keys, pointers, the checkpoint
pointer), no pickle from the store, verified reads (a tampered, truncated or missing shard), verified skips and
corrupt manifests (a rerun over a manifest it cannot read refuses instead of skipping or overwriting), bounded
input, clean errors and credentials redaction. A case may ``seed`` the store first (a staged partition, or a
store carried through fit-pca with tiny models, copied from a template built once per module), then damage it.

Each case runs ``hpd`` as a process of its own, forked from a zygote that has loaded the libraries the commands
import (tests/support/warm_cli.py): the console script's exit code, output and files, without seconds of imports of
torch, transformers and faiss per case.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from tasks.core import config, manifest, storage
from tasks.core.catalog import Stage
from tests.support import store_state
from tests.support.projected_store import PCA_NAME, corpus_lines, projected_store

pytestmark = pytest.mark.models

DAY = ["--ingest-date", "2026-11-30"]
STAGED_DAY = date(2026, 11, 30)
SECRET = "topsecret"
FILE, S3, BOTH = ("file",), ("s3",), ("file", "s3")
RAW_FOLDER = "raw"  # where an S3 case's raw files lie in its bucket, beside the store root
STORE_ROOT = "root"  # the store's prefix in an S3 case's bucket
STAGED_MANIFEST = "manifests/stage_corpus/ingest_date=2026-11-30.json"
RUN = "resumable"  # the distill run whose checkpoint folder the no-pickle cases plant into
CHECKPOINTS = f"students/{RUN}/checkpoints"
DISTILL_VALUES: dict[str, Any] = {
    "pca_name": PCA_NAME,
    "name": RUN,
    "batch_size": 16,
    "max_steps": 2,
    "val_fraction": 0.2,
    "device": "cpu",  # no ``threads``: an in-process run would set torch's thread count for the whole session
}
DISTILL = (
    "distill",
    "--store",
    "{store}",
    "--teacher",
    "{teacher}",
    "--student",
    "{student}",
    *(item for name, value in DISTILL_VALUES.items() for item in ("--" + name.replace("_", "-"), str(value))),
)
AUGMENT = ("augment", "--store", "{store}", "--methods", "delete", *DAY)
# staging another day beside the staged one: it de-duplicates against the staged partition
STAGE_NEXT_DAY = ("stage-corpus", "--store", "{store}", "--source", "{src}/raw.txt", "--ingest-date", "2026-12-01")
RESTAGE = ("stage-corpus", "--store", "{store}", "--source", "{src}/raw.txt", "--shard-rows", "5", *DAY)
NO_CHANGE: dict[str, list[str]] = {"added": [], "removed": [], "altered": []}


@dataclass(frozen=True)
class Place:
    """Where one case runs: its backend, scratch folder, store root URI, raw-file folder URI and bucket."""

    backend: str
    scratch: Path
    store: str
    src: str
    bucket: str
    request: pytest.FixtureRequest


Seed = Callable[[Place], dict[str, str]]  # prepares the store; returns more names for the arguments and message


@dataclass(frozen=True)
class Case:
    """One bad input: the ``hpd`` arguments, the exit code and a text the error message holds, with ``{tmp}``
    (the scratch folder), ``{src}`` (the folder of raw files: the scratch folder, or ``s3://<bucket>/raw``),
    ``{store}`` (the store root URI), ``{bucket}`` and whatever ``seed`` returns filled in. ``on`` names the
    backends the case runs on; its S3 variant's id ends in ``-s3``."""

    name: str
    argv: tuple[str, ...]
    code: int
    expected: str
    on: tuple[str, ...] = FILE
    seed: Seed | None = None


# -- seeds: what a case finds in its store ---------------------------------------------------------------------
def _staged(place: Place) -> dict[str, str]:
    """The staged partition of the module's template (12 sentences, shards of 5, 5 and 2 rows)."""
    store_state.copy_into(place.request.getfixturevalue("staged_template"), place.store)
    document = json.loads(storage.read_bytes(storage.join(place.store, STAGED_MANIFEST)))
    return {
        "manifest": storage.join(place.store, STAGED_MANIFEST),
        "shard": storage.join(place.store, document["outputs"][0]["key"]),
    }


def _flip_a_bit(place: Place) -> dict[str, str]:
    """A staged shard with one bit flipped, same size: only its checksum tells."""
    names = _staged(place)
    body = bytearray(storage.read_bytes(names["shard"]))
    body[len(body) // 2] ^= 0x01
    storage.write_bytes(names["shard"], bytes(body))
    return names


def _flip_a_bit_before_the_id_index(place: Place) -> dict[str, str]:
    """A tampered shard in a store staged before the staged-id index: staging rebuilds the index from it."""
    names = _flip_a_bit(place)
    for uri in storage.list_uris(storage.join(place.store, "staged_ids")):
        storage.delete(uri)
    return names


def _flip_a_bit_in_the_id_index(place: Place) -> dict[str, str]:
    """A segment of the staged-id index with one bit flipped, same size: only its recorded checksum tells."""
    names = _staged(place)
    index = json.loads(storage.read_bytes(storage.join(place.store, "staged_ids/index.json")))
    segment = storage.join(place.store, next(iter(index["segments"])))
    body = bytearray(storage.read_bytes(segment))
    body[len(body) // 2] ^= 0x01
    storage.write_bytes(segment, bytes(body))
    return {**names, "segment": segment}


def _truncate(place: Place) -> dict[str, str]:
    names = _staged(place)
    storage.write_bytes(names["shard"], storage.read_bytes(names["shard"])[:100])
    return names


def _delete_shard(place: Place) -> dict[str, str]:
    names = _staged(place)
    storage.delete(names["shard"])
    return names


def _manifest(edit: Callable[[dict[str, Any]], object] | bytes) -> Seed:
    """The staged partition with its manifest replaced by ``edit`` (bytes), or changed in place by it."""

    def seed(place: Place) -> dict[str, str]:
        names = _staged(place)
        if isinstance(edit, bytes):
            storage.write_bytes(names["manifest"], edit)
            return names
        document = json.loads(storage.read_bytes(names["manifest"]))
        edit(document)
        storage.write_bytes(names["manifest"], json.dumps(document).encode())
        return names

    return seed


def _outside(place: Place) -> str:
    """The URI of an existing object outside the store: the raw text file beside it."""
    return storage.to_uri(f"{place.src}/raw.txt")


def _index_pointer(index: Callable[[Place], str], garbage: bool = False) -> Seed:
    """``indexes/current.json`` naming ``index(place)`` as the index (and, with ``garbage``, a promoted index
    whose files are no FAISS index and no Parquet file, recorded as such by its build manifest)."""

    def seed(place: Place) -> dict[str, str]:
        named = index(place)
        if garbage:
            run = manifest.StageRun(Stage.BUILD_INDEX, "tiny", place.store, {"model_run": "tiny"}, [])
            for name in ("index.faiss", "ids.parquet"):
                run.write_output(storage.join(place.store, "indexes/tiny/0123456789ab", name), b"not an index")
            run.publish()
        pointer = {
            "index": named,
            "ids": named.replace("index.faiss", "ids.parquet"),
            "manifest": "manifests/build_index/tiny.json",
            "model_run": "tiny",
            "dim": 8,
            "run_id": "r",
        }
        storage.write_bytes(storage.join(place.store, "indexes/current.json"), json.dumps(pointer).encode())
        return {"index": named, "pointer": storage.join(place.store, "indexes/current.json")}

    return seed


def _model_pointer(place: Place) -> dict[str, str]:
    pointer = {"model_run": "tiny", "scores": {}, "validation": "manifests/validate/../../../escape.json"}
    storage.write_bytes(storage.join(place.store, "models/current.json"), json.dumps(pointer).encode())
    return {"pointer": storage.join(place.store, "models/current.json")}


def _linked_out(name: str, level: int = 0) -> Seed:
    """The staged partition with its object ``name`` (``manifest`` or ``shard``), or its ``level``-th folder up,
    moved outside the store (beside it, in the scratch folder) and a symbolic link left in its place: the same
    bytes, only the link leaves the store."""

    def seed(place: Place) -> dict[str, str]:
        names = _staged(place)
        inside = Path(names[name][len("file://") :])
        for _ in range(level):
            inside = inside.parent
        outside = place.scratch / f"moved-{inside.name}"
        inside.rename(outside)
        inside.symlink_to(outside)
        return {**names, "real": str(place.scratch / f"moved-{inside.name}")}

    return seed


def _truncated(pointer: str) -> Seed:
    """``pointer`` (``models/current.json`` or ``indexes/current.json``) cut short mid-document, as a full disk
    or a torn copy leaves it."""

    def seed(place: Place) -> dict[str, str]:
        uri = storage.join(place.store, pointer)
        storage.write_bytes(uri, b'{"index": "indexes/tiny/0123456789ab/index.fa')
        return {"pointer": uri}

    return seed


def _binary_pair_file(place: Place) -> dict[str, str]:
    """A pair file that is an image, not CSV text."""
    uri = storage.to_uri(f"{place.src}/pairs.csv")
    storage.write_bytes(uri, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return {"pairs": uri}


class _Planted:
    """Unpickling it touches a file in the scratch folder: outside the store, so the case would see it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return (Path.touch, (self.marker,))


def _checkpoint(body: Callable[[Place, str], bytes] | None, key: Callable[[Place], str] | None = None) -> Seed:
    """The module's projected store, and a ``latest.json`` of the distill run ``RUN`` (with its fingerprint)
    naming a planted checkpoint ``body(place, fingerprint)``, or naming ``key(place)``."""

    def seed(place: Place) -> dict[str, str]:
        template = place.request.getfixturevalue("projected_template")
        store_state.copy_into(template["folder"], place.store)
        named = f"{CHECKPOINTS}/step-00000001.pt"
        if body is not None:
            storage.write_bytes(storage.join(place.store, named), body(place, template["fingerprint"]))
        if key is not None:
            named = key(place)
        pointer = {"key": named, "step": 1, "fingerprint": template["fingerprint"], "init": {}}
        storage.write_bytes(storage.join(place.store, CHECKPOINTS, "latest.json"), json.dumps(pointer).encode())
        return {
            "teacher": template["teacher"],
            "student": template["student"],
            "checkpoint": storage.join(place.store, named) if "://" not in named else named,
            "named": named,
        }

    return seed


def _torch_saved_pickle(place: Place, fingerprint: str) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save({"fingerprint": fingerprint, "model": _Planted(place.scratch / "pwned")}, buffer)
    return buffer.getvalue()


def _raw_pickle(place: Place, fingerprint: str) -> bytes:
    return pickle.dumps({"fingerprint": fingerprint, "model": _Planted(place.scratch / "pwned")})


# -- the table ----------------------------------------------------------------------------------------------------
CASES = [
    # clean errors: parameters
    Case(
        "store-scheme",
        ("stage-corpus", "--store", "ftp://host/x", "--source", "{tmp}/raw.txt", *DAY),
        2,
        "ftp://host/x: unsupported scheme 'ftp'",
    ),
    Case(
        "store-relative-file-uri",
        ("stage-corpus", "--store", "file://relative/x", "--source", "{tmp}/raw.txt", *DAY),
        2,
        "file://relative/x: file URIs need an absolute path",
    ),
    Case(
        "store-without-bucket",
        ("stage-corpus", "--store", "s3://", "--source", "{src}/raw.txt", *DAY),
        2,
        "s3://: S3 URIs need a bucket",
        on=S3,
    ),
    Case(
        "search-store-scheme",
        ("search", "a query", "--store", "ftp://host/x"),
        2,
        "--store: ftp://host/x",
    ),
    Case("search-k-zero", ("search", "a query", "-k", "0", "--store", "{store}"), 2, "0 is not within 1-1000"),
    Case(
        "search-k-huge",
        ("search", "a query", "-k", "10000000", "--store", "{store}"),
        2,
        "10000000 is not within 1-1000",
    ),
    Case(
        "impossible-date",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--ingest-date", "2026-13-45"),
        2,
        "--ingest-date",
    ),
    Case(
        "unknown-format",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--format", "xml", *DAY),
        2,
        "invalid choice: 'xml'",
    ),
    Case(
        "negative-shard-rows",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--shard-rows", "-1", *DAY),
        2,
        "--shard-rows: Input should be greater than 0",
    ),
    Case(
        "zero-limit",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--limit", "0", *DAY),
        2,
        "--limit: Input should be greater than 0",
    ),
    Case("zero-k", ("fit-pca", "--store", "{store}", "--k", "0"), 2, "--k: Input should be greater than 0"),
    Case(
        "composite-teacher-repeated",
        ("fit-pca", "--store", "{store}", "--teacher", "all-MiniLM-L6-v2+all-MiniLM-L6-v2"),
        2,
        "teacher 'all-MiniLM-L6-v2+all-MiniLM-L6-v2': a composite teacher joins distinct",
    ),
    Case(
        "back-translation-without-models",
        ("augment", "--store", "{store}", "--methods", "back_translation", *DAY),
        2,
        "back_translation needs translate_forward and translate_backward",
    ),
    Case(
        "grad-accum-not-dividing",
        ("distill", "--store", "{store}", "--batch-size", "10", "--grad-accum", "3"),
        2,
        "batch_size 10 is not divisible by grad_accum 3",
    ),
    Case(
        "fp16-on-cpu", ("distill", "--store", "{store}", "--amp", "fp16", "--device", "cpu"), 2, "fp16 AMP needs CUDA"
    ),
    Case(
        "bad-augment-method",
        ("augment", "--store", "{store}", "--methods", "shout", *DAY),
        2,
        "invalid choice: 'shout'",
    ),
    # credentials: refused, and never echoed
    Case(
        "store-credentials",
        ("stage-corpus", "--store", f"s3://AKIAEXAMPLE:{SECRET}@bucket/p", "--source", "{tmp}/raw.txt", *DAY),
        2,
        "credentials do not belong in a URI",
    ),
    Case(
        "search-store-credentials",
        ("search", "a query", "--store", f"s3://AKIAEXAMPLE:{SECRET}@{{bucket}}/{STORE_ROOT}"),
        2,
        "--store: s3://{bucket}/root: credentials do not belong in a URI",
        on=S3,
    ),
    Case(
        "source-credentials",
        ("stage-corpus", "--store", "{store}", "--source", f"s3://AKIAEXAMPLE:{SECRET}@bucket/raw.txt", *DAY),
        1,
        "s3://bucket/raw.txt: credentials do not belong in a URI",
    ),
    Case(
        "source-credentials-in-bucket",
        ("stage-corpus", "--store", "{store}", "--source", f"s3://AKIAEXAMPLE:{SECRET}@{{bucket}}/raw/raw.txt", *DAY),
        1,
        "s3://{bucket}/raw/raw.txt: credentials do not belong in a URI",
        on=S3,
    ),
    Case(
        "manifest-with-credentials",
        AUGMENT,
        1,
        "{manifest}: not a manifest (invalid at inputs/0/uri",
        on=BOTH,
        seed=_manifest(lambda d: d["inputs"][0].update(uri=f"s3://AKIAEXAMPLE:{SECRET}@bucket/raw.txt")),
    ),
    # containment: names that become path segments, and what the store names
    Case(
        "pca-name-dot-dot",
        ("distill", "--store", "{store}", "--pca-name", ".."),
        2,
        "--pca-name: String should match pattern",
        on=BOTH,
    ),
    Case(
        "model-run-traversal",
        ("validate", "--store", "{store}", "--model-run", "../../escape"),
        2,
        "--model-run: String should match pattern",
        on=BOTH,
    ),
    Case(
        "index-name-with-slash",
        ("build-index", "--store", "{store}", "--name", "a/b"),
        2,
        "name: String should match pattern",
    ),
    Case("hidden-pca-run", ("fit-pca", "--store", "{store}", "--name", ".hidden"), 2, "name: String should match"),
    Case(
        "distill-run-traversal",
        ("distill", "--store", "{store}", "--name", "../../escape"),
        2,
        "name: String should match pattern",
    ),
    Case(
        "manifest-key-traversal",
        AUGMENT,
        1,
        "{manifest}: not a manifest (invalid at outputs/0/key",
        on=BOTH,
        seed=_manifest(lambda d: d["outputs"][0].update(key="../raw/raw.txt")),
    ),
    Case(
        "index-pointer-outside-store",
        ("search", "a query", "--store", "{store}"),
        1,
        "{pointer} names {index}, outside the store {store}; refused",
        on=BOTH,
        seed=_index_pointer(_outside),
    ),
    Case(
        "index-pointer-traversal",
        ("search", "a query", "--store", "{store}"),
        1,
        "{pointer}: not a indexes/current.json pointer (../raw/index.faiss: not a store-relative key",
        on=BOTH,
        seed=_index_pointer(lambda place: "../raw/index.faiss"),
    ),
    Case(
        "model-pointer-traversal",
        ("build-index", "--store", "{store}"),
        1,
        "{pointer}: not a models/current.json pointer",
        on=BOTH,
        seed=_model_pointer,
    ),
    Case(
        "checkpoint-pointer-outside",
        DISTILL,
        1,
        "{store}/students/resumable/checkpoints/latest.json: names '{named}', outside this run's checkpoints",
        on=BOTH,
        seed=_checkpoint(None, key=_outside),
    ),
    Case(
        "manifest-linked-out",
        AUGMENT,
        1,
        "{manifest}: resolves to {real}, outside the store {store}, through a link; refused",
        seed=_linked_out("manifest"),
    ),
    Case(
        "shard-linked-out",
        AUGMENT,
        1,
        "{shard}: resolves to {real}, outside the store {store}, through a link; refused",
        seed=_linked_out("shard"),
    ),
    Case(
        "partition-folder-linked-out",
        AUGMENT,
        1,
        "outside the store {store}, through a link; refused",
        seed=_linked_out("shard", level=1),
    ),
    # every command that reads a pointer names a pointer it cannot read
    *(
        Case(
            f"truncated-{pointer.split('/')[0]}-pointer-{argv[0]}",
            argv,
            1,
            f"{{pointer}}: not a {pointer} pointer (not readable JSON: ",
            on=BOTH,
            seed=_truncated(pointer),
        )
        for pointer, argv in (
            ("indexes/current.json", ("search", "a query", "--store", "{store}")),
            ("indexes/current.json", ("gc", "--store", "{store}", "--dry-run")),
            ("indexes/current.json", ("lineage", "--store", "{store}")),
            ("models/current.json", ("build-index", "--store", "{store}")),
            ("models/current.json", ("lineage", "models/current.json", "--store", "{store}")),
        )
    ),
    Case(
        "binary-pair-file",
        ("validate", "--store", "{store}", "--model-run", "tiny", "--pair-files", "{pairs}"),
        1,
        "{pairs}: not UTF-8 text (byte 0); pair files are CSV or TSV",
        on=BOTH,
        seed=_binary_pair_file,
    ),
    # no pickle from the store
    Case(
        "planted-pickle-checkpoint",
        DISTILL,
        1,
        "{checkpoint}: not a safe checkpoint, refused",
        on=BOTH,
        seed=_checkpoint(_torch_saved_pickle),
    ),
    Case(
        "raw-pickle-checkpoint",
        DISTILL,
        1,
        "{checkpoint}: corrupted or incompatible checkpoint (not a torch archive); refused",
        seed=_checkpoint(_raw_pickle),
    ),
    # verified reads
    Case(
        "tampered-shard",
        AUGMENT,
        1,
        "{shard}: sha256 mismatch: expected",
        on=BOTH,
        seed=_flip_a_bit,
    ),
    Case(
        "tampered-shard-read-for-dedup",
        STAGE_NEXT_DAY,
        1,
        "{shard}: sha256 mismatch: expected",
        on=BOTH,
        seed=_flip_a_bit_before_the_id_index,
    ),
    Case(
        "tampered-staged-id-index",
        STAGE_NEXT_DAY,
        1,
        "{segment}: sha256 mismatch: expected",
        on=BOTH,
        seed=_flip_a_bit_in_the_id_index,
    ),
    Case("truncated-shard", AUGMENT, 1, "{shard}: sha256 mismatch: expected", on=BOTH, seed=_truncate),
    Case("missing-shard", AUGMENT, 1, "{shard}: object does not exist", on=BOTH, seed=_delete_shard),
    Case(
        "index-not-faiss",
        ("search", "a query", "--store", "{store}"),
        1,
        "{index}: not a FAISS index",
        on=BOTH,
        seed=_index_pointer(lambda place: storage.join(place.store, "indexes/tiny/0123456789ab/index.faiss"), True),
    ),
    # verified skips and corrupt manifests: a rerun neither skips nor overwrites what it cannot read
    Case(
        "manifest-not-json",
        AUGMENT,
        1,
        "{manifest}: not a readable manifest",
        on=BOTH,
        seed=_manifest(b'{"stage": '),
    ),
    Case(
        "rerun-over-unreadable-manifest",
        RESTAGE,
        1,
        "{manifest}: not a readable manifest",
        on=BOTH,
        seed=_manifest(b"\xff\xfe not json"),
    ),
    Case(
        "manifest-not-schema-valid",
        AUGMENT,
        1,
        "{manifest}: not a manifest (invalid at (root): 'fingerprint' is a required property)",
        on=BOTH,
        seed=_manifest(lambda d: d.pop("fingerprint")),
    ),
    Case(
        "rerun-over-old-manifest-version",
        RESTAGE,
        1,
        "{manifest}: manifest version 1 is not supported",
        on=BOTH,
        seed=_manifest(lambda d: d.update(manifest_version=1)),
    ),
    # nothing upstream yet
    Case(
        "search-no-index",
        ("search", "a query", "--store", "{store}"),
        1,
        "{store}/indexes/current.json: no index promoted yet",
        on=BOTH,
    ),
    Case("nothing-staged", ("encode-teacher", "--store", "{store}", *DAY), 1, "no sentences staged for ingest_date"),
    Case(
        "no-pca-run",
        ("distill", "--store", "{store}", "--pca-name", "k8-missing"),
        1,
        "{store}: no PCA run 'k8-missing'",
    ),
    Case(
        "no-distill-run",
        ("validate", "--store", "{store}", "--model-run", "missing"),
        1,
        "no published distill run 'missing'",
    ),
    Case(
        "augment-nothing-staged",
        ("augment", "--store", "{store}", *DAY),
        1,
        "{store}: no sentences staged for ingest_date=2026-11-30",
        on=BOTH,
    ),
    Case(
        "quality-nothing-staged",
        ("quality", "--store", "{store}", *DAY),
        1,
        "nothing staged for ingest_date=2026-11-30",
    ),
    Case(
        "fit-pca-nothing-encoded",
        ("fit-pca", "--store", "{store}"),
        1,
        "no teacher embeddings of 'all-mpnet-base-v2+all-MiniLM-L6-v2'",
    ),
    Case(
        "build-index-nothing-promoted",
        ("build-index", "--store", "{store}"),
        1,
        "{store}: no promoted model",
    ),
    Case(
        "store-bucket-missing",
        ("stage-corpus", "--store", "s3://{bucket}-gone/root", "--source", "{src}/raw.txt", *DAY),
        1,
        "s3://{bucket}-gone/root/manifests/stage_corpus/ingest_date=2026-11-30.json: bucket '{bucket}-gone' does not",
        on=S3,
    ),
    # raw input: bad or oversized sources
    Case(
        "missing-source",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/missing.txt", *DAY),
        1,
        "{src}/missing.txt: no such file",
        on=BOTH,
    ),
    Case(
        "empty-source",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/empty.txt", *DAY),
        1,
        "{src}/empty.txt: the input is empty",
        on=BOTH,
    ),
    Case(
        "binary-source",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/binary.txt", *DAY),
        1,
        "{src}/binary.txt: not valid UTF-8",
        on=BOTH,
    ),
    Case(
        "gzip-bomb",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/bomb.txt.gz", "--max-input-bytes", "100000", *DAY),
        1,
        "{src}/bomb.txt.gz: decompresses to more than max_input_bytes=100000 bytes",
        on=BOTH,
    ),
    Case(
        "source-too-large",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/raw.txt", "--max-input-bytes", "5", *DAY),
        1,
        "{src}/raw.txt: 12 bytes, more than max_input_bytes=5",
        on=BOTH,
    ),
    Case(
        "line-too-long",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/long.txt", "--max-line-chars", "50", *DAY),
        1,
        "{src}/long.txt: line 2 holds 60 characters, more than max_line_chars=50",
        on=BOTH,
    ),
    Case(
        "truncated-gzip",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/cut.txt.gz", *DAY),
        1,
        "{src}/cut.txt.gz: corrupt gzip data (truncated)",
        on=BOTH,
    ),
    Case(
        "jsonl-not-json",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/bad.jsonl", *DAY),
        1,
        "{src}/bad.jsonl: line 2 is not JSON",
        on=BOTH,
    ),
    Case(
        "jsonl-without-field",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/other.jsonl", *DAY),
        1,
        "other.jsonl: line 1 has no field 'text'",
    ),
    Case(
        "csv-without-column",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/table.csv", *DAY),
        1,
        "table.csv: no column 'text'",
    ),
    Case(
        "parquet-that-is-not",
        ("stage-corpus", "--store", "{store}", "--source", "{src}/fake.parquet", *DAY),
        1,
        "{src}/fake.parquet: not a Parquet file",
        on=BOTH,
    ),
    Case(
        "unknown-suffix",
        ("stage-corpus", "--store", "{store}", "--source", "{tmp}/notes.xyz", *DAY),
        1,
        "notes.xyz: cannot tell the format from the name",
    ),
]
PARAMS = [
    pytest.param(case, backend, id=case.name if backend == "file" else f"{case.name}-s3", marks=marks)
    for case in CASES
    for backend, marks in (("file", ()), ("s3", (pytest.mark.s3,)))
    if backend in case.on
]
RAW_FILES = {
    "raw.txt": b"A sentence.\n",
    "empty.txt": b"",
    "binary.txt": b"ok line\n\xff\xfe\xfa not text\n",
    "bomb.txt.gz": gzip.compress(b"a" * 10_000_000),  # 10 MB from about 10 kB
    "long.txt": b"short\n" + b"x" * 60 + b"\n",
    "bad.jsonl": b'{"text": "fine"}\n{"text": \n',
    "other.jsonl": b'{"sentence": "wrong field"}\n',
    "table.csv": b"id,sentence\n1,hello\n",
    "fake.parquet": b"PAR1 this is not parquet at all",
    "notes.xyz": b"a line\n",
    "cut.txt.gz": gzip.compress(b"a sentence\n" * 1000)[:-30],
}


# -- fixtures -----------------------------------------------------------------------------------------------------
@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    for name, body in RAW_FILES.items():
        (tmp_path / name).write_bytes(body)
    return tmp_path


@pytest.fixture(scope="module")
def staged_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store folder holding one staged partition: 12 sentences in shards of 5, 5 and 2 rows."""
    from tasks.stages import stage_corpus

    root = tmp_path_factory.mktemp("staged")
    (root / "raw.txt").write_text("\n".join(f"Sentence number {i} is staged here." for i in range(12)))
    values = {"store": str(root / "store"), "source": str(root / "raw.txt"), "ingest_date": STAGED_DAY, "shard_rows": 5}
    stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
    return root / "store"


class _Captured(Exception):
    """Ends a distill run once its checkpoint fingerprint is known, before anything is trained or written."""


@pytest.fixture(scope="module")
def projected_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store folder carried through fit-pca with tiny models (60 sentences, one shard), the model folders,
    and the checkpoint fingerprint of the distill run ``DISTILL`` starts there."""
    from tasks.stages import distill

    root = tmp_path_factory.mktemp("projected")
    prepared = projected_store(root, corpus_lines(60), STAGED_DAY, shard_rows=60)
    seen: dict[str, str] = {}

    def capture(self: Any, force: bool) -> None:
        seen["fingerprint"] = self.checkpoints.fingerprint
        raise _Captured

    values = {"store": prepared["store"], "teacher": prepared["teacher"], "student": prepared["student"]}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distill.Trainer, "restore_or_initialise", capture)
        with pytest.raises(_Captured):
            distill.run(config.parse(distill.DistillParams, {**values, **DISTILL_VALUES}))
    return {**prepared, "folder": root / "store", "fingerprint": seen["fingerprint"]}


def _place(backend: str, scratch: Path, request: pytest.FixtureRequest) -> Place:
    if backend == "file":
        return Place(backend, scratch, storage.to_uri(str(scratch / "store")), str(scratch), "", request)
    bucket = request.getfixturevalue("s3_bucket")
    src = f"s3://{bucket}/{RAW_FOLDER}"
    for name, body in RAW_FILES.items():
        storage.write_bytes(f"{src}/{name}", body)
    return Place(backend, scratch, f"s3://{bucket}/{STORE_ROOT}", src, bucket, request)


def _world(place: Place) -> tuple[store_state.Snapshot, store_state.Snapshot]:
    """(every object of the store, everything around it): the scratch folder, and on S3 the rest of the
    bucket and the list of buckets."""
    local = store_state.folder_snapshot(place.scratch)
    if place.backend == "file":
        return store_state.split(local, "store")
    store, bucket_rest = store_state.split(store_state.bucket_snapshot(place.bucket), STORE_ROOT)
    around = {f"local:{k}": v for k, v in local.items()} | {f"s3:{k}": v for k, v in bucket_rest.items()}
    return store, around | {f"bucket:{name}": b"" for name in store_state.bucket_names()}


def _run_hpd(hpd: Path, argv: list[str], cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HPD_STORE"}
    done = subprocess.run([str(hpd), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(("case", "backend"), PARAMS)
def test_bad_input_is_refused_cleanly(case, backend, scratch, request, warm_hpd):
    place = _place(backend, scratch, request)
    names = {"tmp": str(scratch), "src": place.src, "store": place.store, "bucket": place.bucket}
    if case.seed is not None:
        names |= case.seed(place)
    argv = [a.format_map(names) for a in case.argv]
    store_before, around_before = _world(place)
    code, out, err = _run_hpd(warm_hpd, argv, scratch)  # a default ./var/store would land in the scratch folder
    said = out + err
    assert code == case.code, said
    assert case.expected.format_map(names) in err, err
    assert "Traceback" not in said
    assert SECRET not in said
    store_after, around_after = _world(place)
    assert store_state.changes(store_before, store_after) == NO_CHANGE, "the store changed"
    assert store_state.changes(around_before, around_after) == NO_CHANGE, "something was written outside the store"
