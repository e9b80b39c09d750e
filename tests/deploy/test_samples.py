"""The sample days (data/samples/<date>/sentences.txt): what the deployments seed as raw data and the own-data page and
the local-Airflow walkthrough stage. Each day holds a few hundred sentences of the vendored corpus that no other day
and no demo run (the corpus's first rows) holds, so staging a day after the demo stages new sentences."""

import csv
import gzip
from dataclasses import fields
from datetime import date, timedelta

from tasks.core.sentences import normalise_text
from tasks.demo import SAMPLE, DemoPlan
from tests.support.paths import REPO

SAMPLES = REPO / "data" / "samples"
DAYS = ("2026-11-10", "2026-11-11", "2026-11-12")


def _corpus() -> list[str]:
    with gzip.open(REPO / SAMPLE, "rt", encoding="utf-8", newline="") as rows:
        return [row["sentence"] for row in csv.DictReader(rows, delimiter="\t", quoting=csv.QUOTE_NONE)]


def test_each_sample_day_is_new_corpus_sentences():
    """Three consecutive days, each one text file of 200 to 500 distinct sentences, one a line: rows of the vendored
    corpus past those the demo stages (its first ``DemoPlan.rows``), no sentence in two days."""
    assert sorted(path.name for path in SAMPLES.iterdir()) == list(DAYS)
    first = date.fromisoformat(DAYS[0])
    assert [date.fromisoformat(day) - first for day in DAYS] == [timedelta(days=n) for n in range(len(DAYS))]
    (demo_rows,) = [field.default for field in fields(DemoPlan) if field.name == "rows"]
    corpus = _corpus()
    staged = {normalise_text(text) for text in corpus[:demo_rows]}
    later = set(corpus[demo_rows:])
    for day in DAYS:
        (path,) = (SAMPLES / day).iterdir()
        lines = path.read_text(encoding="utf-8").splitlines()
        normal = {normalise_text(line) for line in lines}
        assert path.name == "sentences.txt" and 200 <= len(normal) == len(lines) <= 500, day
        assert set(lines) <= later and not normal & staged, day
        staged |= normal
