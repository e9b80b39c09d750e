"""The student's k-d flat index against the teacher's D-d one, on the same corpus.

Corpus: the staged sentences of ``bench/distill_quality`` (run it first; this reuses its
store and its MiniLM-L6 student). Teacher vectors: the pipeline's all-mpnet-base-v2 embeddings
(768-d); student vectors: the distilled student's (128-d); both L2-normalised in exact FAISS
inner-product indexes. Reports index bytes, queries/s at batch 1 and 64 (the same 200 corpus
queries), and recall@10 of the student's neighbours against the teacher's exact neighbours.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from bench import distill_quality, results
from tasks.core import catalog, manifest, parquet_shards, sentences, storage
from tasks.core.catalog import Stage
from tasks.ml import models, student, vector_index

STUDENT_RUN = "recipe-MiniLM-L6"
QUERIES = 1000


def main() -> dict:
    import faiss
    import torch

    from tasks.ml.encoder import SentenceEncoder

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))
    store, day = distill_quality.STORE, distill_quality.DAY
    if manifest.read(store, Stage.DISTILL, STUDENT_RUN) is None:
        raise SystemExit("run `python -m bench distill_quality` first: this benchmark reuses its store and student")
    shards = sentences.shards(store, day, (Stage.STAGE_CORPUS,))
    texts, teacher = [], []
    for uri in shards:
        texts.extend(storage.read_parquet(uri, columns=["text"]).column("text").to_pylist())
        key = catalog.teacher_shard_key(models.DEFAULT_TEACHER, day, uri)
        published = manifest.read(store, Stage.ENCODE_TEACHER, key)
        teacher.append(parquet_shards.vectors(storage.read_parquet(published.outputs[0].uri), "embedding"))
    with tempfile.TemporaryDirectory() as scratch:
        student_model = SentenceEncoder.load(str(student.fetch_exported(store, STUDENT_RUN, Path(scratch))))
        student_vectors = student_model.encode(texts, batch_size=128)
    vectors = {"teacher": np.concatenate(teacher), "student": np.ascontiguousarray(student_vectors)}
    queries_at = np.random.default_rng(0).choice(len(texts), QUERIES, replace=False)
    measured, neighbours = {}, {}
    for name, x in vectors.items():
        faiss.normalize_L2(x)
        index = vector_index.build(x, "Flat", 1)
        speed = vector_index.measure(index, x)
        _, neighbours[name] = index.search(x[queries_at], 11)
        measured[name] = {"dim": int(x.shape[1]), "bytes": len(faiss.serialize_index(index)), **speed}
    # The query itself is its own nearest neighbour in both: compare the next 10.
    recall = float(
        np.mean(
            [
                len(set(s[1:]) & set(t[1:])) / 10
                for s, t in zip(neighbours["student"], neighbours["teacher"], strict=True)
            ]
        )
    )
    student_m, teacher_m = measured["student"], measured["teacher"]
    return results.write(
        "index",
        unit="queries/s (batch 64, flat)",
        ours=student_m["queries_per_s_batch64"],
        baseline=teacher_m["queries_per_s_batch64"],
        baseline_name="teacher 768-d flat index",
        higher_is_better=True,
        details={
            "rows": len(texts),
            "by_index": measured,
            "bytes_ratio": round(teacher_m["bytes"] / student_m["bytes"], 2),
            "qps_ratio_batch1": round(student_m["queries_per_s_batch1"] / teacher_m["queries_per_s_batch1"], 2),
            "qps_ratio_batch64": round(student_m["queries_per_s_batch64"] / teacher_m["queries_per_s_batch64"], 2),
            "recall_at_10_student_vs_teacher_exact": round(recall, 4),
            "queries_for_recall": QUERIES,
            "paper_1024_to_128": {"memory": 8.0, "speed": 8.2},
        },
    )


if __name__ == "__main__":
    print(main())
