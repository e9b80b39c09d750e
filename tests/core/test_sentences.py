from datetime import date

from tasks.core import config, storage
from tasks.core.catalog import partition_key
from tasks.core.sentences import already_staged, normalise_text, sentence_id
from tasks.stages import stage_corpus

DAY1, DAY2 = date(2026, 11, 1), date(2026, 11, 2)


def test_already_staged_matches_across_partitions_and_honours_the_exclusion(tmp_path):
    store = storage.to_uri(str(tmp_path / "store"))
    for day, lines in ((DAY1, ["alpha one", "beta two", "gamma three"]), (DAY2, ["delta four", "epsilon five"])):
        (tmp_path / f"{day}.txt").write_text("\n".join(lines))
        stage_corpus.run(
            config.parse(
                stage_corpus.StageCorpusParams,
                {"store": store, "source": str(tmp_path / f"{day}.txt"), "ingest_date": day, "shard_rows": 2},
            )
        )
    ids = {text: sentence_id(text) for text in ("beta two", "epsilon five", "never staged")}

    assert already_staged(store, list(ids.values())) == {ids["beta two"], ids["epsilon five"]}
    assert already_staged(store, list(ids.values()), exclude_key=partition_key(DAY2)) == {ids["beta two"]}
    assert already_staged(store, [ids["never staged"]]) == set()
    assert already_staged(store, []) == set()


def test_control_characters_become_spaces():
    assert normalise_text("a\x00b\x07 c\x1b[31m\x7f d\x85e") == "a b c [31m d e"
    assert normalise_text("caf\u0065\u0301 \u200d kept") == "caf\u00e9 \u200d kept"  # NFC; a joiner is not a control
