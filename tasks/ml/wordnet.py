"""WordNet 3.0 for synonym substitution, from Debian's ``wordnet-base`` / ``wordnet-sense-index``.

``python -m tasks.ml.wordnet`` (run by ``make``) copies the database from ``/usr/share/wordnet`` into
``<nltk_data>/corpora/wordnet`` and adds the ``lexnames`` file NLTK's reader expects (Debian does
not ship it). :func:`load` opens it, or fails with a message saying how to install it.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from functools import cache
from pathlib import Path

DEBIAN_WORDNET = Path("/usr/share/wordnet")
FILES = (
    "adj.exc",
    "adv.exc",
    "noun.exc",
    "verb.exc",
    "cntlist.rev",
    "data.adj",
    "data.adv",
    "data.noun",
    "data.verb",
    "index.adj",
    "index.adv",
    "index.noun",
    "index.verb",
    "index.sense",
)
# The 45 lexicographer files, in WordNet's order: number, name, syntactic category (1 n, 2 v, 3 a, 4 r).
LEXNAMES = (
    ["adj.all", "adj.pert", "adv.all", "noun.Tops"]
    + [
        f"noun.{n}"
        for n in (
            "act",
            "animal",
            "artifact",
            "attribute",
            "body",
            "cognition",
            "communication",
            "event",
            "feeling",
            "food",
            "group",
            "location",
            "motive",
            "object",
            "person",
            "phenomenon",
            "plant",
            "possession",
            "process",
            "quantity",
            "relation",
            "shape",
            "state",
            "substance",
            "time",
        )
    ]
    + [
        f"verb.{n}"
        for n in (
            "body",
            "change",
            "cognition",
            "communication",
            "competition",
            "consumption",
            "contact",
            "creation",
            "emotion",
            "motion",
            "perception",
            "possession",
            "social",
            "stative",
            "weather",
        )
    ]
    + ["adj.ppl"]
)
_CATEGORY = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}


class WordNetMissing(RuntimeError):
    """WordNet is not installed where the augmentation stage looks for it."""


def nltk_data_dir() -> Path:
    """``HPD_NLTK_DATA``, else the first ``NLTK_DATA`` entry, else ``~/.cache/hpd-pipeline/nltk_data``."""
    configured = os.environ.get("HPD_NLTK_DATA") or os.environ.get("NLTK_DATA", "").split(os.pathsep)[0]
    return Path(configured) if configured else Path.home() / ".cache" / "hpd-pipeline" / "nltk_data"


def lexnames_text() -> str:
    return "".join(f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n" for i, name in enumerate(LEXNAMES))


def install(target: Path | None = None, source: Path = DEBIAN_WORDNET) -> Path:
    """Copy Debian's WordNet into ``<target>/corpora/wordnet`` with a lexnames file; returns that folder."""
    folder = (target or nltk_data_dir()) / "corpora" / "wordnet"
    missing = [name for name in FILES if not (source / name).is_file()]
    if missing:
        raise WordNetMissing(
            f"{source}: WordNet files {missing} not found; install Debian's wordnet-base and "
            f"wordnet-sense-index (apt-get install wordnet-base wordnet-sense-index)"
        )
    scratch = folder.with_name(".wordnet-installing")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(source / name, scratch / name)
    (scratch / "lexnames").write_text(lexnames_text())
    shutil.rmtree(folder, ignore_errors=True)
    scratch.rename(folder)
    return folder


def load(data_dir: Path | None = None):
    """NLTK's WordNet reader over the installed copy (parsed once per process: it takes seconds)."""
    return _load(data_dir or nltk_data_dir())


@cache
def _load(data_dir: Path):
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    folder = data_dir / "corpora" / "wordnet"
    if not (folder / "lexnames").is_file() or not (folder / "data.noun").is_file():
        raise WordNetMissing(
            f"{folder}: WordNet 3.0 is not installed there; run `make venv` (or "
            f"`python -m tasks.ml.wordnet`) after `apt-get install wordnet-base wordnet-sense-index`"
        )
    if str(data_dir) not in nltk.data.path:  # NLTK only reads corpora from its data path
        nltk.data.path.insert(0, str(data_dir))
    with warnings.catch_warnings():  # "multilingual functions are not available": no OMW, by design
        warnings.simplefilter("ignore", UserWarning)
        return WordNetCorpusReader(nltk.data.find("corpora/wordnet"), None)


if __name__ == "__main__":
    try:
        print(install(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
    except WordNetMissing as exc:
        sys.exit(str(exc))
