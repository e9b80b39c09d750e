"""Where the checkout's parts are, for tests that read the repository itself (DAG files, deployment
files, the vendored corpus). The package's own data is found through ``importlib.resources``."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
INFRA = REPO / "infra"
CORPUS = REPO / "data" / "corpus" / "sentences.tsv.gz"
SUPPORT = Path(__file__).resolve().parent
