import json
import logging
from datetime import date

import pyarrow as pa
import pytest

from tasks.core import catalog, config, manifest, sentences, storage, teacher_sample
from tasks.core.catalog import Stage
from tasks.ml import wordnet
from tasks.stages import augment, stage_corpus
from tests.support.tiny_models import build_marian

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
ORIGINALS = [
    "The quick brown fox jumps over the lazy dog",
    "A large house stands near the old river",
    "Students read interesting books in the quiet library",
    "alpha beta",
    "beta alpha",
    "Markets rallied after the central bank cut interest rates",
]


def _stage(store, tmp_path, texts=ORIGINALS):
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(texts))
    stage_corpus.run(
        config.parse(stage_corpus.StageCorpusParams, {"store": store, "source": str(source), "ingest_date": DAY})
    )


def _run(store, **extra):
    return augment.run(config.parse(augment.AugmentParams, {"store": store, "ingest_date": DAY, **extra}))


def _rows(store):
    published = manifest.read(store, Stage.AUGMENT, catalog.partition_key(DAY))
    return pa.concat_tables([storage.read_parquet(o.uri) for o in published.outputs]).to_pylist()


@pytest.fixture
def store(store_root, tmp_path):
    _stage(store_root, tmp_path)
    return store_root


@pytest.fixture
def originals(store):
    return {
        r["sentence_id"]: r["text"]
        for r in pa.concat_tables([storage.read_parquet(u) for u in sentences.shards(store, DAY)]).to_pylist()
    }


def test_wordnet_replaces_content_words_with_real_synonyms(store, originals):
    result = _run(store, methods=["wordnet"], synonym_rate=0.5)
    rows = _rows(store)
    assert rows and all(r["aug_method"] == "wordnet" for r in rows)
    reader = wordnet.load()
    for row in rows:
        parent = originals[row["parent_id"]]
        assert row["text"] != parent and row["sentence_id"] == sentences.sentence_id(row["text"])
        assert json.loads(row["aug_params"]) == {"synonym_rate": 0.5, "wordnet": "3.0"}
        assert row["source"].startswith("sentences/ingest_date=2026-11-01/part-")  # below whichever store reads it
        synonym_words = {
            part.lower()
            for word in parent.lower().split()
            for synset in reader.synsets(word)
            for lemma in synset.lemma_names()
            for part in lemma.split("_")
        }
        new_words = set(row["text"].lower().split()) - set(parent.lower().split())
        assert new_words and new_words <= synonym_words
    assert result.stats["by_method"]["wordnet"]["written"] == len(rows)
    manifest.validate(result.manifest.document)
    assert _run(store, methods=["wordnet"], synonym_rate=0.5).skipped


def test_token_operations_keep_the_parents_words(store, originals):
    _run(store, methods=["delete", "swap"], delete_rate=0.3)
    rows = _rows(store)
    assert {r["aug_method"] for r in rows} == {"delete", "swap"}
    for row in rows:
        parent_words, words = originals[row["parent_id"]].split(), row["text"].split()
        if row["aug_method"] == "swap":
            assert sorted(words) == sorted(parent_words)
        else:
            assert len(words) < len(parent_words) and all(w in parent_words for w in words)


def test_variants_equal_to_an_original_are_dropped(store, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    result = _run(store, methods=["swap"])
    assert {"alpha beta", "beta alpha"}.isdisjoint(r["text"] for r in _rows(store))
    counts = result.stats["by_method"]["swap"]
    assert counts["dropped_equals_original"] == 2
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.stages.augment"]
    assert lines[0].startswith("augment swap: finished 6/6 rows (100.0%) in ")
    assert lines[1] == f"augment ingest_date=2026-11-01: swap {', '.join(f'{n} {why}' for why, n in counts.items())}"
    assert "6 generated" in lines[1] and "4 written" in lines[1] and "2 dropped_equals_original" in lines[1]


def test_deterministic_for_a_seed(tmp_path):
    stores = [storage.to_uri(str(tmp_path / name)) for name in ("a", "b", "c")]
    for s in stores:
        _stage(s, tmp_path)
    for s, seed in zip(stores, (1, 1, 2), strict=True):
        _run(s, methods=["wordnet", "delete", "swap"], seed=seed)
    outputs = [_rows(s) for s in stores]  # every column, the parent shard's key too: nothing names the store
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_fraction_selects_a_deterministic_subset(store):
    _run(store, methods=["swap"], fraction=0.5, seed=3)
    first = {r["parent_id"] for r in _rows(store)}
    _run(store, methods=["swap"], fraction=0.5, seed=3, shard_rows=2)
    assert {r["parent_id"] for r in _rows(store)} == first


def test_back_translation_with_local_marian_models(store, tmp_path, originals):
    corpus = ORIGINALS * 20
    forward = build_marian(tmp_path / "en-xx", corpus, seed=1)
    backward = build_marian(tmp_path / "xx-en", corpus, seed=2)
    params = {
        "methods": ["back_translation"],
        "translate_forward": str(forward),
        "translate_backward": str(backward),
        "translate_batch_size": 4,
        "translate_max_tokens": 12,
    }
    result = _run(store, **params)
    rows = _rows(store)
    stats = result.stats["by_method"]["back_translation"]
    assert stats["generated"] == len(originals) and stats["written"] == len(rows) > 0
    assert all(r["parent_id"] in originals and r["aug_method"] == "back_translation" for r in rows)
    assert json.loads(rows[0]["aug_params"])["forward"] == "en-xx"
    again = storage.to_uri(str(tmp_path / "again"))
    _stage(again, tmp_path)
    _run(again, **params)
    assert [r["text"] for r in _rows(again)] == [r["text"] for r in rows]


def test_back_translation_needs_both_models(store):
    with pytest.raises(config.ConfigError, match="translate_forward and translate_backward"):
        _run(store, methods=["back_translation"], translate_forward="x")


def test_missing_wordnet_is_a_clear_error(store, tmp_path, monkeypatch):
    monkeypatch.setenv("HPD_NLTK_DATA", str(tmp_path / "empty"))
    with pytest.raises(augment.AugmentError, match="WordNet 3.0 is not installed"):
        _run(store, methods=["wordnet"])
    assert manifest.read(store, "augment", f"ingest_date={DAY}") is None


def test_nothing_staged(store_root):
    with pytest.raises(augment.AugmentError, match="no sentences staged"):
        _run(store_root)


def test_teacher_encoding_covers_augmented_shards(store):
    _run(store, methods=["swap"])
    names = [uri.rsplit("/", 3)[-3] for uri in sentences.shards(store, DAY)]
    assert names == ["sentences", "sentences_aug"]


def test_only_sentences_the_teacher_sample_can_hold_are_varied_and_the_sample_holds_each_with_its_variants(
    store, originals, tmp_path
):
    """With a teacher sample of 4 rows, augmentation varies only the first 4 staged sentences of the sample's order
    (no variant of another could be sampled); the teacher then encodes exactly 4 rows: the first sentences of the
    order, each followed by its variant."""
    from tasks.stages import encode_teacher
    from tests.support.tiny_models import build_sentence_model

    order = teacher_sample.ordered(list(originals), 0)
    _run(store, methods=["swap"], teacher_sample=4)
    varied = [row["parent_id"] for row in _rows(store)]
    assert varied and set(varied) <= set(order[:4])
    assert not set(varied) & set(order[4:])

    model = build_sentence_model(tmp_path / "tiny")
    values = {"store": store, "teacher": str(model), "ingest_date": DAY, "teacher_sample": 4}
    encoded = encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))
    assert encoded.stats["rows"] == 4 and encoded.stats["rows_available"] == len(originals) + len(varied)
    variant_of = {row["parent_id"]: row["sentence_id"] for row in _rows(store)}
    expected = [sid for parent in order for sid in (parent, variant_of.get(parent)) if sid][:4]
    sampled = {
        sid
        for uri in encode_teacher.output_shards(store, str(model), DAY)
        for sid in storage.read_parquet(uri).column("sentence_id").to_pylist()
    }
    assert sampled == set(expected)
