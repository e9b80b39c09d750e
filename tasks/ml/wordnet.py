"""WordNet 3.0 for synonym substitution, from Debian's ``wordnet-base`` / ``wordnet-sense-index``.

``python -m tasks.ml.wordnet`` (run by ``make venv``) copies the database into ``<nltk_data>/corpora/wordnet``
and adds the ``lexnames`` file NLTK's reader expects (Debian does not ship it). It reads ``/usr/share/wordnet``
where the packages are installed; otherwise it fetches them without root (:func:`fetch_debian`: ``apt-get
download`` and ``dpkg-deb -x`` into a user cache). :func:`load` opens the copy, or fails saying how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path

from tasks.core import settings

DEBIAN_WORDNET = Path("/usr/share/wordnet")
PACKAGES = ("wordnet-base", "wordnet-sense-index")
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
    configured = settings.current().nltk_data or os.environ.get("NLTK_DATA", "").split(os.pathsep)[0]
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


def fetch_debian(cache: Path, apt_get: str = "apt-get") -> Path:
    """Debian's WordNet packages unpacked under ``cache`` without root; returns their ``usr/share/wordnet``.

    ``apt-get download`` reads the system's package lists; where there are none (no ``apt-get update`` was run),
    it is retried after an update into lists of ``cache``'s own. ``dpkg-deb -x`` unpacks without installing.
    """
    debs, unpacked = cache / "debs", cache / "root"
    debs.mkdir(parents=True, exist_ok=True)
    if _apt(apt_get, ["download", *PACKAGES], debs).returncode:
        private = [f"-o=Dir::State::Lists={cache / 'lists'}", f"-o=Dir::Cache={cache / 'apt'}"]
        for folder in (cache / "lists" / "partial", cache / "apt" / "archives" / "partial"):
            folder.mkdir(parents=True, exist_ok=True)
        for args in ([*private, "-o=Debug::NoLocking=1", "update"], [*private, "download", *PACKAGES]):
            done = _apt(apt_get, args, debs)
            if done.returncode:
                raise WordNetMissing(f"`apt-get {args[-1]}` failed: {done.stdout[-2000:]}")
    for package in PACKAGES:
        deb = max(debs.glob(f"{package}_*.deb"))  # apt-get download succeeded: it is there
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    return unpacked / DEBIAN_WORDNET.relative_to("/")


def _apt(apt_get: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = [apt_get, "-q", *args]
    return subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def source_folder(cache: Path | None = None) -> Path:
    """``/usr/share/wordnet`` where Debian's packages are installed, else a copy fetched into ``cache``."""
    if all((DEBIAN_WORDNET / name).is_file() for name in FILES):
        return DEBIAN_WORDNET
    return fetch_debian(cache or Path.home() / ".cache" / "hpd-pipeline" / "wordnet-debian")


def load(data_dir: Path | None = None):
    """NLTK's WordNet reader over the installed copy (parsed once per process: it takes seconds)."""
    return _load(data_dir or nltk_data_dir())


def synonyms_of(reader) -> Callable[[str], list[str]]:
    """A lookup of a word's WordNet synonyms through ``reader`` (each lemma of each of its synsets, the word
    itself left out, sorted), each word looked up once."""

    @cache
    def synonyms(word: str) -> list[str]:
        names = {lemma.name().replace("_", " ") for synset in reader.synsets(word) for lemma in synset.lemmas()}
        return sorted(n for n in names if n.lower() != word)

    return synonyms


@cache
def _load(data_dir: Path):
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    folder = data_dir / "corpora" / "wordnet"
    if not (folder / "lexnames").is_file() or not (folder / "data.noun").is_file():
        raise WordNetMissing(
            f"{folder}: WordNet 3.0 is not installed there; run `make venv` (or `python -m tasks.ml.wordnet`, "
            f"which fetches Debian's wordnet-base and wordnet-sense-index without root)"
        )
    if str(data_dir) not in nltk.data.path:  # NLTK only reads corpora from its data path
        nltk.data.path.insert(0, str(data_dir))
    with warnings.catch_warnings():  # "multilingual functions are not available": no OMW, by design
        warnings.simplefilter("ignore", UserWarning)
        return WordNetCorpusReader(nltk.data.find("corpora/wordnet"), None)


if __name__ == "__main__":
    try:
        print(install(Path(sys.argv[1]) if len(sys.argv) > 1 else None, source_folder()))
    except WordNetMissing as exc:
        sys.exit(str(exc))
