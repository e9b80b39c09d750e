"""gc and the promoted index: a ``--no-promote`` rebuild under the promoted name, then the loss of the promoted
build's kept manifest version (a bad copy or sync), stops gc before it deletes anything."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from tasks import cli
from tasks.core import catalog, config
from tasks.stages import build_index
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models


def _build(store: str, promote: bool, force: bool = False) -> None:
    values = {"store": store, "model_run": "tiny", "index_type": "flat", "name": "tiny", "promote": promote}
    build_index.run(config.parse(build_index.BuildIndexParams, values), force=force)


def _files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_gc_stops_when_the_promoted_builds_kept_version_is_lost(tmp_path, capsys):
    prepared = projected_store(tmp_path, corpus_lines(40), date(2026, 11, 1), shard_rows=20)
    store, root = prepared["store"], tmp_path / "store"
    distill_tiny(prepared, "tiny", max_steps=2)
    _build(store, promote=True)
    _build(store, promote=False, force=True)  # the name's latest is now a build no pointer names
    promoted, _ = catalog.read_pointer(store, catalog.Pointer.INDEX)
    assert promoted is not None and promoted.manifest.endswith(f"/{promoted.run_id}.json")
    Path(promoted.manifest.removeprefix("file://")).unlink()
    before = _files(root)

    capsys.readouterr()
    assert cli.main(["gc", "--store", store, "--retention-hours", "0", "--quiet"]) == 1
    err = capsys.readouterr().err
    pointer = catalog.pointer_uri(store, catalog.Pointer.INDEX)
    assert f"{promoted.manifest}: missing, and {pointer} names it" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert _files(root) == before  # nothing deleted, no gc run recorded
