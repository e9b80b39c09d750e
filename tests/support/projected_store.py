"""A store carried through the stages a distillation needs, with tiny models: corpus staged, encoded by a
tiny teacher and projected to k=8 dims (fit-pca run ``k8-uncentered``)."""

from __future__ import annotations

import gzip
from datetime import date
from pathlib import Path
from typing import Any

from tasks.core import config, manifest, storage
from tasks.stages import distill, encode_teacher, fit_pca, stage_corpus
from tasks.stages.params import DistillParams
from tests.support.paths import CORPUS
from tests.support.tiny_models import build_sentence_model

PCA_NAME = "k8-uncentered"


def corpus_lines(count: int) -> list[str]:
    """The first ``count`` sentences of the vendored corpus."""
    with gzip.open(CORPUS, "rt") as f:
        next(f)  # header
        return [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(count)]


def projected_store(
    root: Path, lines: list[str], day: date, shard_rows: int, teacher_sample: int = 0
) -> dict[str, str]:
    """Stage ``lines`` as partition ``day``, encode them (every row, or a ``teacher_sample``) with a tiny teacher
    (48-d) and fit the PCA to 8 dims. Returns the store URI and the tiny teacher and student (32-d) model folders."""
    (root / "raw.txt").write_text("\n".join(lines))
    teacher = str(build_sentence_model(root / "teacher", hidden=48, seed=1))
    student = str(build_sentence_model(root / "student", hidden=32, seed=2))
    store = storage.to_uri(str(root / "store"))
    stage_corpus.run(
        config.parse(
            stage_corpus.StageCorpusParams,
            {"store": store, "source": str(root / "raw.txt"), "ingest_date": day, "shard_rows": shard_rows},
        )
    )
    encoded = {"store": store, "teacher": teacher, "ingest_date": day, "teacher_sample": teacher_sample}
    encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, encoded))
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": teacher, "k": 8}))
    return {"store": store, "teacher": teacher, "student": student}


# The stage's default selection: the exported weights (and blends) chosen on STS dev; each choice scores both dev
# sets. Fixtures that need a distilled run, not its selection, choose on validation MSE with no blends.
STS_DEV_SELECTION = {"select_on": "sts_dev", "blend_initial": DistillParams.model_fields["blend_initial"].default}
MSE_SELECTION = {"select_on": "val_mse", "blend_initial": []}


def distill_tiny(prepared: dict[str, str], name: str, max_steps: int, **settings: Any) -> manifest.StageResult:
    """A short single-threaded distillation of ``prepared``'s tiny student, published as run ``name``, its weights
    chosen on validation MSE (``**STS_DEV_SELECTION`` in ``settings``: the stage's default selection)."""
    values = {
        **MSE_SELECTION,
        "store": prepared["store"],
        "teacher": prepared["teacher"],
        "student": prepared["student"],
        "pca_name": PCA_NAME,
        "max_steps": max_steps,
        "batch_size": 16,
        "val_fraction": 0.1,
        "name": name,
        "threads": 1,
        **settings,
    }
    return distill.run(config.parse(distill.DistillParams, values))
