"""Benchmarks: each compares a stage with the tool a user would otherwise use, in one run, and writes
``bench/results/<name>.json`` (``make bench`` runs them all). They run from the checkout."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "corpus" / "sentences.tsv.gz"
