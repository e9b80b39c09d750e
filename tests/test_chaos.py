"""Chaos: every stage that publishes or promotes, SIGKILLed before each of its commits, before the write that
follows each (between a publish and the next step), before its first write and one in the middle, then
rerun; and run twice at once. An index version of several segments (a day kept, a day encoded) is killed before
and after each segment's files too. The store ends as a clean run leaves it (:mod:`tests.support.chaos`): the same
objects, the same pointers, every field two clean runs agree on the same, and nothing listed that does not
verify. On file://, and on S3 (where the kills are of the stages whose commits differ from a folder's).

Each stage runs on a store carried through the stages before it with tiny models (:func:`chain`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tasks.core import config, storage
from tasks.core.catalog import Stage
from tasks.stages import encode_teacher, stage_corpus
from tests.support import chaos, store_state
from tests.support.projected_store import MSE_SELECTION, corpus_lines, projected_store

pytestmark = pytest.mark.models

DAY, DAY2 = date(2026, 11, 1), date(2026, 11, 2)
SHARD_ROWS = 40
Values = Callable[[dict[str, str], str], dict[str, Any]]


def _distill(prepared: dict[str, str], store: str) -> dict[str, Any]:
    return {
        "store": store,
        "teacher": prepared["teacher"],
        "student": prepared["student"],
        "pca_name": "k8-uncentered",
        "max_steps": 4,
        "eval_every": 2,
        "checkpoint_every": 2,
        "batch_size": 16,
        "val_fraction": 0.1,
        "name": "tiny",
        "threads": 1,
        **MSE_SELECTION,  # what is chosen changes no write: the kills need not score STS dev at every evaluation
    }


def _validate(prepared: dict[str, str], store: str) -> dict[str, Any]:
    return {"store": store, "model_run": "tiny", "retrieval_sample": 60, "max_regression": 100.0}


def _index(prepared: dict[str, str], store: str) -> dict[str, Any]:
    return {"store": store, "model_run": "tiny", "index_type": "flat", "name": "tiny"}


@dataclass(frozen=True)
class Case:
    """A stage, the chain store it runs on, and its params (from the chain's models and the store's URI)."""

    stage: Stage
    on: str
    values: Values

    @property
    def name(self) -> str:
        return self.stage if self.on != "two_days" else f"{self.stage}-two-segments"


CASES = [
    Case(
        Stage.STAGE_CORPUS,
        "empty",
        lambda p, s: {"store": s, "source": p["source"], "ingest_date": DAY, "shard_rows": SHARD_ROWS},
    ),
    Case(Stage.AUGMENT, "staged", lambda p, s: {"store": s, "ingest_date": DAY, "methods": ["delete", "swap"]}),
    Case(Stage.ENCODE_TEACHER, "staged", lambda p, s: {"store": s, "teacher": p["teacher"], "ingest_date": DAY}),
    Case(Stage.QUALITY, "projected", lambda p, s: {"store": s, "ingest_date": DAY, "teacher": p["teacher"]}),
    Case(Stage.FIT_PCA, "encoded", lambda p, s: {"store": s, "teacher": p["teacher"], "k": 8}),
    Case(Stage.DISTILL, "projected", _distill),
    Case(Stage.VALIDATE, "distilled", _validate),
    Case(Stage.BUILD_INDEX, "distilled", _index),
    Case(Stage.BUILD_INDEX, "two_days", _index),
    Case(Stage.DRIFT, "promoted", lambda p, s: {"store": s, "ingest_date": DAY}),
    Case(Stage.GC, "restaged", lambda p, s: {"store": s, "retention_hours": 0}),
]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, str]:
    """Store folders at each point of a chain (``empty`` ... ``promoted``), the raw source and tiny models; built
    once for every pytest-xdist worker of the session (the first builds it under a lock, the others read it)."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    record = shared / "chaos-chain.json"
    with FileLock(str(shared / "chaos-chain.lock")):
        if not record.is_file():
            record.write_text(json.dumps(_build_chain(shared / "chaos-chain")))
    return json.loads(record.read_text())


def _build_chain(root: Path) -> dict[str, str]:
    (root / "built").mkdir(parents=True)
    prepared = {**projected_store(root / "built", corpus_lines(120), DAY, SHARD_ROWS), "source": ""}
    prepared["source"] = str(root / "built" / "raw.txt")
    built = root / "built" / "store"
    folders = {"empty": root / "empty", "projected": built}
    folders["empty"].mkdir()
    for name, keep in (("staged", ("sentences", "manifests/stage_corpus", "staged_ids")),):
        folders[name] = _subset(built, root / name, keep)
    folders["encoded"] = _subset(built, root / "encoded", ("sentences", "staged_ids", "teacher", "manifests"))
    shutil.rmtree(folders["encoded"] / "manifests" / "fit_pca")
    for name, after, step in (
        ("distilled", "projected", lambda s: chaos.run(Stage.DISTILL, _distill(prepared, s))),
        (
            "promoted",
            "distilled",
            lambda s: [
                chaos.run(Stage.VALIDATE, _validate(prepared, s)),
                chaos.run(Stage.BUILD_INDEX, _index(prepared, s)),
            ],
        ),
        ("two_days", "promoted", lambda s: _second_day(prepared, root, s)),
        (
            "restaged",
            "staged",
            lambda s: chaos.run(
                Stage.STAGE_CORPUS, {"store": s, "source": prepared["source"], "ingest_date": DAY, "shard_rows": 30}
            ),
        ),
    ):
        folders[name] = root / name
        shutil.copytree(folders[after], folders[name])
        step(storage.to_uri(str(folders[name])))
    return {**prepared, **{name: str(folder) for name, folder in folders.items()}}


def _second_day(prepared: dict[str, str], root: Path, store: str) -> None:
    """A second partition staged and encoded beside the promoted index of the first: the next build keeps the first
    day's segment and encodes the second's."""
    raw = root / "day2.txt"
    raw.write_text("\n".join(corpus_lines(160)[120:]))
    values = {"store": store, "source": str(raw), "ingest_date": DAY2, "shard_rows": SHARD_ROWS}
    stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
    values = {"store": store, "teacher": prepared["teacher"], "ingest_date": DAY2}
    encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))


def _subset(source: Path, target: Path, keep: tuple[str, ...]) -> Path:
    for part in keep:
        shutil.copytree(source / part, target / part)
    return target


def _copy(chain: dict[str, str], on: str, target: Path, bucket: str | None) -> str:
    """The chain's store ``on`` copied to a folder (``bucket`` None) or to a prefix of ``bucket``."""
    if bucket is None:
        shutil.copytree(chain[on], target)
        return storage.to_uri(str(target))
    store = f"s3://{bucket}/{target.name}"
    store_state.copy_into(Path(chain[on]), store)
    return store


# On S3 the kills are of the stages whose commits differ from a folder's beyond the manifest's compare-and-swap
# (the staged-id index, a promotion); every stage runs twice at once there but the three whose only commit on
# S3 is that compare-and-swap and whose runs take longest (their folder races stand for them; validate's
# promotion race is build_index's).
KILLED_ON_S3 = (Stage.STAGE_CORPUS, Stage.BUILD_INDEX)
RACED_ON_S3 = tuple(c.stage for c in CASES if c.stage not in (Stage.DISTILL, Stage.VALIDATE, Stage.QUALITY))


def _cases() -> list[Any]:
    on_file = [pytest.param(case, None, id=f"{case.name}-file") for case in CASES]
    on_s3 = [
        pytest.param(case, "s3", id=f"{case.name}-s3", marks=pytest.mark.s3)
        for case in CASES
        if case.stage in RACED_ON_S3
    ]
    return on_file + on_s3


@pytest.fixture
def bucket(request: pytest.FixtureRequest, backend: str | None) -> str | None:
    return None if backend is None else request.getfixturevalue("s3_bucket")


@pytest.mark.parametrize(("case", "backend"), _cases())
def test_a_stage_killed_at_any_commit_and_rerun_or_run_twice_at_once_ends_as_one_clean_run(
    chain, case, bucket, tmp_path
):
    """Against two clean runs: the stage SIGKILLed at each kill point then rerun; and two runs of it at once
    (one publishes and promotes, the other publishes the same work or fails naming the conflict)."""
    first, second = (_copy(chain, case.on, tmp_path / f"clean-{n}", bucket) for n in (1, 2))
    writes = chaos.recorded_writes(case.stage, case.values(chain, first))
    chaos.run(case.stage, case.values(chain, second))
    reference = chaos.state(first)
    expected = chaos.stable(reference, chaos.state(second))
    killed = bucket is None or case.stage in KILLED_ON_S3
    for position in chaos.kill_points(writes) if killed else []:
        store = _copy(chain, case.on, tmp_path / f"kill{position:03d}", bucket)  # as long a name as clean-N
        chaos.killed_before(position, case.stage, case.values(chain, store))
        chaos.run(case.stage, case.values(chain, store))
        where = f"killed before write {position} of {len(writes)} ({writes[position - 1]})"
        assert chaos.unverified(store) == [], where
        assert chaos.differences(expected, reference, chaos.state(store)) == [], where
    store = _copy(chain, case.on, tmp_path / "raced-1", bucket)
    chaos.at_once(2, case.stage, case.values(chain, store))
    assert chaos.unverified(store) == [], "two runs at once"
    assert chaos.differences(expected, reference, chaos.state(store)) == [], "two runs at once"
