"""Drift profiles of corpus partitions, one per partition and PCA run, published as artifacts with manifests.

A partition's profile (:class:`tasks.ml.drift_stats.Profile`) covers its staged sentences (augmented variants
aside: drift is about the raw data) and their teacher embeddings, under a fitted PCA projection; each
shard, and the projection, is read verified against the sha256 its writer's manifest records. The profile
goes to ``profiles/<teacher>/<pca run>/ingest_date=D/<fp12>/profile.json`` with a ``profile`` manifest
whose inputs are the shards and the PCA artifact, so it is computed once and again only when they change.
"""

from __future__ import annotations

import json
from datetime import date

from tasks.core import catalog, manifest, storage
from tasks.core.catalog import Stage
from tasks.ml import drift_stats
from tasks.ml.projection import Projection, published_projection
from tasks.stages import encode_teacher

PROFILE = "profile.json"


class DriftError(ValueError):
    """Drift cannot be measured (nothing staged or encoded, no model run); the message names the input."""


def ensure(store: str, teacher: str, pca_name: str, day: date) -> manifest.Output:
    """The published profile of partition ``day`` under ``teacher``'s PCA run ``pca_name``, profiled now when
    there is none for the current shards and projection."""
    artifact, projection = published_projection(store, teacher, pca_name)
    pairs = encode_teacher.encoded(store, teacher, day, (Stage.STAGE_CORPUS,))
    if not pairs:
        raise DriftError(f"{store}: nothing staged for {catalog.partition_key(day)}")
    missing = [shard.uri for shard, encoded in pairs if encoded is None]
    if missing:
        raise DriftError(f"{len(missing)} sentences shard(s) not encoded by {teacher!r} yet, e.g. {missing[0]}")
    shards = [(shard, encoded.outputs[0]) for shard, encoded in pairs if encoded is not None]
    stage_run = manifest.StageRun(
        stage=Stage.PROFILE,
        key=catalog.profile_key(teacher, pca_name, day),
        store=store,
        params={"teacher": teacher, "pca_name": pca_name, "ingest_date": day.isoformat()},
        inputs=[artifact.as_input(), *(item.as_input() for pair in shards for item in pair)],
    )
    if skipped := stage_run.skip_result(force=False):
        return skipped.outputs[0]
    with stage_run.phase("profile"):
        found = drift_stats.merged(
            _shard_profile(sentences, embeddings, projection) for sentences, embeddings in shards
        )
    uri = catalog.profile_uri(store, teacher, pca_name, day, stage_run.fingerprint)
    stage_run.write_output(uri, json.dumps(found.to_dict(), sort_keys=True).encode(), rows=found.rows)
    stage_run.stats = found.summary()
    return stage_run.publish().outputs[0]


def read(output: manifest.Output) -> drift_stats.Profile:
    """A published profile, verified against the sha256 its manifest records."""
    return drift_stats.Profile.from_dict(json.loads(storage.read_bytes(output.uri, sha256=output.sha256)))


def _shard_profile(
    sentences: manifest.Output, embeddings: manifest.Output, projection: Projection
) -> drift_stats.Profile:
    """The profile of the rows of one sentences shard the teacher encoded (its sample), with their texts."""
    rows = encode_teacher.read_encoded(sentences, embeddings)
    return drift_stats.profile(rows.texts, rows.vectors, projection)
