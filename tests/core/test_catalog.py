"""The catalog's layout (the documented store paths and manifest keys), its run-name rules and the
compare-and-swap pointers on both stores."""

from __future__ import annotations

import json
import re
from datetime import date

import pytest

from tasks.core import catalog, storage
from tasks.core.catalog import IndexPointer, ModelPointer, Pointer, PointerMoved, Stage

STORE = "s3://bucket/root"
DAY = date(2026, 11, 30)
FP = "0123456789abcdef0123456789abcdef"
HUB_TEACHER = "sentence-transformers/all-mpnet-base-v2"


# -- paths --------------------------------------------------------------------------------------------------
def test_sentences_prefix_per_writer():
    assert (
        catalog.sentences_prefix(STORE, Stage.STAGE_CORPUS, DAY) == "s3://bucket/root/sentences/ingest_date=2026-11-30"
    )
    assert (
        catalog.sentences_prefix(STORE, Stage.AUGMENT, DAY) == "s3://bucket/root/sentences_aug/ingest_date=2026-11-30"
    )
    assert catalog.SENTENCE_WRITERS == (Stage.STAGE_CORPUS, Stage.AUGMENT)


def test_sentences_prefix_on_a_local_store():
    assert (
        catalog.sentences_prefix("file:///data/store/", Stage.STAGE_CORPUS, date(2026, 1, 2))
        == "file:///data/store/sentences/ingest_date=2026-01-02"
    )


def test_teacher_prefix_uses_the_specs_slug():
    assert catalog.slug(HUB_TEACHER) == "all-mpnet-base-v2"
    assert catalog.slug("/models/My Teacher/") == "My_Teacher"
    assert (
        catalog.teacher_prefix(STORE, HUB_TEACHER, DAY)
        == "s3://bucket/root/teacher/all-mpnet-base-v2/ingest_date=2026-11-30"
    )
    assert catalog.teacher_partition(HUB_TEACHER, DAY) == "all-mpnet-base-v2/ingest_date=2026-11-30"


def test_fingerprinted_prefixes_take_its_first_12_chars():
    assert (
        catalog.pca_prefix(STORE, HUB_TEACHER, "k128-uncentered", FP)
        == "s3://bucket/root/pca/all-mpnet-base-v2/k128-uncentered/0123456789ab"
    )


def test_unfingerprinted_prefixes():
    assert (
        catalog.targets_prefix(STORE, HUB_TEACHER, "k64-centered")
        == "s3://bucket/root/targets/all-mpnet-base-v2/k64-centered"
    )
    assert catalog.checkpoints_prefix(STORE, "run-1") == "s3://bucket/root/students/run-1/checkpoints"


def test_dataset_at_names_each_shard_by_where_the_catalog_puts_it():
    """The reverse of the prefixes: a shard's dataset from its URI; other objects and foreign URIs are none."""
    index = catalog.index_prefix(STORE, "student-a", FP)
    shards = {
        catalog.sentences_prefix(STORE, Stage.STAGE_CORPUS, DAY): catalog.Dataset.SENTENCES,
        catalog.sentences_prefix(STORE, Stage.AUGMENT, DAY): catalog.Dataset.SENTENCES,
        catalog.teacher_prefix(STORE, HUB_TEACHER, DAY): catalog.Dataset.TEACHER_EMBEDDINGS,
        catalog.targets_prefix(STORE, HUB_TEACHER, "k128-uncentered"): catalog.Dataset.PROJECTED_TARGETS,
        storage.join(index, "student_embeddings"): catalog.Dataset.STUDENT_EMBEDDINGS,
    }
    for prefix, dataset in shards.items():
        assert catalog.dataset_at(STORE, storage.join(prefix, "part-00000-0123abcd.parquet")) == dataset
    assert catalog.dataset_at(STORE, storage.join(index, "ids-0123abcd.parquet")) == catalog.Dataset.INDEX_IDS
    others = [
        storage.join(index, "index.faiss"),
        catalog.manifest_uri(STORE, Stage.STAGE_CORPUS, "ingest_date=2026-11-30"),
        catalog.quality_results_uri(STORE, DAY, FP),
        "s3://elsewhere/sentences/ingest_date=2026-11-30/part-00000.parquet",
    ]
    assert [catalog.dataset_at(STORE, uri) for uri in others] == [None] * len(others)


def test_manifest_uris():
    key = catalog.partition_key(DAY)
    assert key == "ingest_date=2026-11-30" and catalog.partition_date(key) == DAY
    assert (
        catalog.manifest_uri(STORE, Stage.STAGE_CORPUS, key)
        == "s3://bucket/root/manifests/stage_corpus/ingest_date=2026-11-30.json"
    )
    assert (
        catalog.manifest_uri(STORE, Stage.FIT_PCA, catalog.pca_key(HUB_TEACHER, "k128-uncentered"))
        == "s3://bucket/root/manifests/fit_pca/all-mpnet-base-v2/k128-uncentered.json"
    )
    assert catalog.manifests_prefix(STORE, Stage.DISTILL) == "s3://bucket/root/manifests/distill"
    assert (
        catalog.manifests_prefix(STORE, Stage.ENCODE_TEACHER, "t/ingest_date=2026-11-30")
        == "s3://bucket/root/manifests/encode_teacher/t/ingest_date=2026-11-30"
    )


def test_pointer_uris():
    assert catalog.pointer_uri(STORE, Pointer.MODEL) == "s3://bucket/root/models/current.json"
    assert catalog.pointer_uri(STORE, Pointer.INDEX) == "s3://bucket/root/indexes/current.json"


# -- manifest keys ------------------------------------------------------------------------------------------
def test_derived_stem_and_teacher_shard_key():
    shard = "s3://bucket/root/sentences/ingest_date=2026-11-30/part-00003.parquet"
    assert catalog.derived_stem(shard) == "sentences-part-00003"
    aug = "file:///s/sentences_aug/ingest_date=2026-11-30/part-00000.parquet"
    assert catalog.derived_stem(aug) == "sentences_aug-part-00000"
    assert (
        catalog.teacher_shard_key(HUB_TEACHER, DAY, shard)
        == "all-mpnet-base-v2/ingest_date=2026-11-30/sentences-part-00003"
    )


# -- names --------------------------------------------------------------------------------------------------
def test_default_names():
    assert catalog.default_pca_name(128, "uncentered") == "k128-uncentered"
    assert (
        catalog.default_student_run("sentence-transformers/all-MiniLM-L6-v2", None, "k128-uncentered")
        == "all-MiniLM-L6-v2-k128-uncentered"
    )
    assert catalog.default_student_run("all-MiniLM-L6-v2", 3, "k64-centered") == "all-MiniLM-L6-v2-L3-k64-centered"


def test_airflow_run_name_is_store_safe():
    name = catalog.airflow_run_name("manual__2026-11-30T10:00:00+00:00")
    assert name == "manual__2026-11-30T10-00-00-00-00"
    assert re.fullmatch(catalog.RUN_NAME_PATTERN, name)
    assert "/" not in catalog.airflow_run_name("scheduled__a/b")


UNSAFE_NAMES = ["a/b", "a b", "x:y", "../up", ".", "..", ".hidden", "/", "a\\b", "x\n", "é"]


@pytest.mark.parametrize("name", ["", *UNSAFE_NAMES])
def test_run_name_pattern_refuses_unsafe_names(name):
    """One path segment, not '.' or '..', not hidden, not empty (a required name)."""
    assert re.fullmatch(catalog.RUN_NAME_PATTERN, name) is None
    if not name.endswith("\n"):  # Python's '$' also matches before a final newline; pydantic's does not
        assert re.search(catalog.RUN_NAME_PATTERN, name) is None  # as JSON Schema (Airflow's form) reads it


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_auto_run_name_pattern_refuses_the_same_names(name):
    assert re.fullmatch(catalog.AUTO_RUN_NAME_PATTERN, name) is None


SAFE_NAMES = ["k128-uncentered", "demo-student", "run.v2", "run_1.v2", "lr=1e-4", "a..b", "trailing.", "-x", "_"]


@pytest.mark.parametrize("name", SAFE_NAMES)
def test_run_name_pattern_accepts_safe_names(name):
    """A dot inside a name is one more character of its one segment ('a..b' included)."""
    assert re.fullmatch(catalog.RUN_NAME_PATTERN, name)
    assert re.fullmatch(catalog.AUTO_RUN_NAME_PATTERN, name)


def test_auto_run_name_pattern_also_takes_the_empty_derived_name():
    assert re.fullmatch(catalog.AUTO_RUN_NAME_PATTERN, "")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("..", "_"),
        (".", "_"),
        ("x/..", "_"),
        ("/", "_"),
        ("", "_"),
        ("models/.hidden", "_hidden"),
        ("/models/..teacher/", "_teacher"),
        ("org/run.v2", "run.v2"),
    ],
)
def test_slug_is_never_empty_dot_dotdot_or_hidden(spec, expected):
    assert catalog.slug(spec) == expected
    assert re.fullmatch(catalog.RUN_NAME_PATTERN, catalog.slug(spec))
    assert catalog.teacher_prefix(STORE, spec, DAY) == f"s3://bucket/root/teacher/{expected}/ingest_date=2026-11-30"


@pytest.mark.parametrize("run_id", ["..", ".", "", ".x", "manual__é/../x"])
def test_airflow_run_name_always_follows_the_name_rule(run_id):
    assert re.fullmatch(catalog.RUN_NAME_PATTERN, catalog.airflow_run_name(run_id))


# -- pointers -----------------------------------------------------------------------------------------------
def _model(run: str, score: float, store: str = "file:///store") -> ModelPointer:
    versions = f"{store}/manifest_versions"
    return ModelPointer(
        run, {"STS-B test": score}, f"{versions}/validate/{run}/1.json", f"{versions}/distill/{run}/2.json"
    )


def _index(store: str) -> IndexPointer:
    return IndexPointer(f"{store}/indexes/x/i.faiss", f"{store}/indexes/x/ids.parquet", f"{store}/m.json", "x", 8, "r")


def test_what_a_pointer_names_is_kept_per_run():
    """The stages whose runs a pointer names publish into a folder of the run's own id, and keep each run's manifest;
    quality's pages (which show their run's times) lie in their run's folder too."""
    assert catalog.student_prefix(STORE, "run-1", "c0ffee") == "s3://bucket/root/students/run-1/c0ffee"
    assert catalog.index_prefix(STORE, "idx", "c0ffee") == "s3://bucket/root/indexes/idx/c0ffee"
    assert catalog.validation_prefix(STORE, "run-1", "c0ffee") == "s3://bucket/root/validation/run-1/c0ffee"
    assert (
        catalog.quality_results_uri(STORE, DAY, "c0ffee")
        == "s3://bucket/root/quality/ingest_date=2026-11-30/c0ffee/results.json"
    )
    assert (
        catalog.quality_data_docs_prefix(STORE, DAY, "c0ffee")
        == "s3://bucket/root/quality/ingest_date=2026-11-30/c0ffee/data_docs"
    )
    assert (
        catalog.manifest_version_uri(STORE, Stage.BUILD_INDEX, "idx", "c0ffee")
        == "s3://bucket/root/manifest_versions/build_index/idx/c0ffee.json"
    )


def test_pointer_is_empty_until_moved(store_root):
    assert catalog.read_pointer(store_root, Pointer.MODEL) == (None, None)
    assert catalog.read_pointer(store_root, Pointer.INDEX) == (None, None)


def test_pointer_compare_and_swap(store_root):
    first = _model("a", 1.0, store_root)
    catalog.move_pointer(store_root, first, None)
    value, etag = catalog.read_pointer(store_root, Pointer.MODEL)
    assert value == first and etag
    assert json.loads(storage.read_bytes(f"{store_root}/models/current.json")) == {
        "model_run": "a",
        "scores": {"STS-B test": 1.0},
        "validation": "manifest_versions/validate/a/1.json",
        "model": "manifest_versions/distill/a/2.json",
    }
    assert catalog.read_pointer(store_root, Pointer.INDEX) == (None, None)  # the other pointer is apart

    with pytest.raises(PointerMoved):  # creating it again: someone else did
        catalog.move_pointer(store_root, _model("z", 0.0, store_root), None)
    assert catalog.read_pointer(store_root, Pointer.MODEL) == (first, etag)

    second = _model("b", 2.0, store_root)
    catalog.move_pointer(store_root, second, etag)
    value, new_etag = catalog.read_pointer(store_root, Pointer.MODEL)
    assert value == second and new_etag != etag

    with pytest.raises(PointerMoved):  # the first etag is stale now
        catalog.move_pointer(store_root, _model("c", 3.0, store_root), etag)
    assert catalog.read_pointer(store_root, Pointer.MODEL) == (second, new_etag)

    third = _model("c", 3.0, store_root)
    catalog.move_pointer(store_root, third, new_etag)
    assert catalog.read_pointer(store_root, Pointer.MODEL)[0] == third


def test_the_index_pointer_round_trips(store_root):
    catalog.move_pointer(store_root, _index(store_root), None)
    assert catalog.read_pointer(store_root, Pointer.INDEX)[0] == _index(store_root)
    assert catalog.read_pointer(store_root, Pointer.MODEL) == (None, None)


def test_moving_a_missing_pointer_with_an_etag_fails(store_root):
    with pytest.raises(PointerMoved):
        catalog.move_pointer(store_root, _index(store_root), '"0123"')
    assert catalog.read_pointer(store_root, Pointer.INDEX) == (None, None)


@pytest.mark.parametrize("pointer", list(Pointer))
def test_a_pointer_naming_an_object_outside_its_store_is_refused(store_root, pointer):
    """A pointer is never followed out of its store: one naming another store's manifest (a hand-made pointer, a
    bad copy) is refused, naming it, whichever object of it is outside."""
    elsewhere = "file:///another-store"
    value = _model("a", 1.0, elsewhere) if pointer is Pointer.MODEL else _index(elsewhere)
    catalog.move_pointer(store_root, value, None)  # recorded as absolute URIs: they are not below this store
    with pytest.raises(catalog.PointerError, match=f"names {elsewhere}/.*, outside the store {store_root}; refused"):
        catalog.read_pointer(store_root, pointer)


def test_a_pointer_of_the_wrong_shape_is_named(store_root):
    uri = catalog.pointer_uri(store_root, Pointer.MODEL)
    storage.write_bytes(uri, json.dumps({"index": "x"}).encode())
    with pytest.raises(catalog.PointerError, match=f"{uri}: not a models/current.json pointer"):
        catalog.read_pointer(store_root, Pointer.MODEL)


# -- store-relative references ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("store", "uri", "key"),
    [
        ("s3://bucket/root", "s3://bucket/root/manifests/distill/x.json", "manifests/distill/x.json"),
        ("s3://bucket", "s3://bucket/models/current.json", "models/current.json"),
        ("file:///srv/store", "file:///srv/store/a/b.parquet", "a/b.parquet"),
        ("file:///srv/store/", "file:///srv/store/a/b.parquet", "a/b.parquet"),
        ("s3://bucket/root", "s3://bucket/root-copy/x.json", None),  # a sibling, not below the root
        ("s3://bucket/root", "s3://bucket/root", None),
        ("s3://bucket/root", "s3://other/root/x.json", None),
        ("file:///srv/store", "file:///raw/in.txt", None),
        ("s3://bucket/root", "s3://bucket/root/a/../../x", None),
        ("s3://bucket/root", "s3://bucket/root//x", None),
    ],
)
def test_store_key(store, uri, key):
    assert catalog.store_key(store, uri) == key
    if key is not None:
        assert catalog.resolve(store, key) == uri


def test_resolve_joins_keys_and_keeps_absolute_uris():
    assert catalog.resolve("s3://b/copy", "indexes/x/index.faiss") == "s3://b/copy/indexes/x/index.faiss"
    assert catalog.resolve("s3://b/copy", "file:///raw/in.txt") == "file:///raw/in.txt"
    for bad in ("a/../../x", "./a", "a//b", "/etc/passwd", ""):
        with pytest.raises(storage.StorageError, match="not a store-relative key"):
            catalog.resolve("s3://b/copy", bad)


def _copy_pointer(source: str, target: str, pointer: Pointer) -> None:
    body = storage.read_bytes(catalog.pointer_uri(source, pointer))
    storage.write_bytes(catalog.pointer_uri(target, pointer), body)


def test_pointers_record_keys_and_resolve_against_the_store_reading_them(store_root):
    model = ModelPointer(
        "a",
        {"STS-B test": 1.0},
        f"{store_root}/manifests/validate/a.json",
        f"{store_root}/manifest_versions/distill/a/r.json",
    )
    index = IndexPointer(
        f"{store_root}/indexes/a/0123456789ab/index.faiss",
        f"{store_root}/indexes/a/0123456789ab/ids.parquet",
        f"{store_root}/manifests/build_index/a.json",
        "a",
        8,
        "r",
    )
    catalog.move_pointer(store_root, model, None)
    catalog.move_pointer(store_root, index, None)
    model_recorded = json.loads(storage.read_bytes(catalog.pointer_uri(store_root, Pointer.MODEL)))
    assert (model_recorded["validation"], model_recorded["model"]) == (
        "manifests/validate/a.json",
        "manifest_versions/distill/a/r.json",
    )
    recorded = json.loads(storage.read_bytes(catalog.pointer_uri(store_root, Pointer.INDEX)))
    assert (recorded["index"], recorded["ids"], recorded["manifest"]) == (
        "indexes/a/0123456789ab/index.faiss",
        "indexes/a/0123456789ab/ids.parquet",
        "manifests/build_index/a.json",
    )
    assert catalog.read_pointer(store_root, Pointer.MODEL)[0] == model
    assert catalog.read_pointer(store_root, Pointer.INDEX)[0] == index
    copy = f"{store_root}-copy"
    for pointer in Pointer:
        _copy_pointer(store_root, copy, pointer)
    copied = catalog.read_pointer(copy, Pointer.INDEX)[0]
    assert copied is not None and copied.index == f"{copy}/indexes/a/0123456789ab/index.faiss"
    assert (copied.ids, copied.manifest) == (
        f"{copy}/indexes/a/0123456789ab/ids.parquet",
        f"{copy}/manifests/build_index/a.json",
    )
    promoted = catalog.read_pointer(copy, Pointer.MODEL)[0]
    assert promoted is not None and promoted.validation == f"{copy}/manifests/validate/a.json"
    assert promoted.model == f"{copy}/manifest_versions/distill/a/r.json"


@pytest.mark.parametrize("reference", ["manifests/../../../etc/passwd.json", "a//b.json", "/abs/x.json"])
def test_a_pointer_key_that_leaves_the_store_is_refused(store_root, reference):
    uri = catalog.pointer_uri(store_root, Pointer.MODEL)
    storage.write_bytes(uri, json.dumps({"model_run": "a", "scores": {}, "validation": reference}).encode())
    with pytest.raises(catalog.PointerError, match=f"{re.escape(uri)}: not a models/current.json pointer"):
        catalog.read_pointer(store_root, Pointer.MODEL)
