"""WordNet without root: Debian's packages fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x``
into a user cache, then copied where NLTK reads them."""

import shutil

import pytest

from tasks.ml import wordnet

pytestmark = pytest.mark.skipif(
    not (shutil.which("apt-get") and shutil.which("dpkg-deb")), reason="needs Debian's apt-get and dpkg-deb"
)


@pytest.mark.slow  # fetches Debian's package lists and 8 MB of packages
def test_fetched_without_system_lists_it_installs_a_wordnet_nltk_reads(tmp_path, monkeypatch):
    empty = tmp_path / "no-lists"
    (empty / "partial").mkdir(parents=True)
    config = tmp_path / "apt.conf"
    config.write_text(f'Dir::State::Lists "{empty}";\n')
    monkeypatch.setenv("APT_CONFIG", str(config))  # as on a machine where no `apt-get update` ran
    source = wordnet.fetch_debian(tmp_path / "cache")
    assert source == tmp_path / "cache" / "root" / "usr" / "share" / "wordnet"
    assert any((tmp_path / "cache" / "lists").glob("*Packages*")), "the fallback updated lists of its own"
    folder = wordnet.install(tmp_path / "nltk_data", source)
    reader = wordnet.load(tmp_path / "nltk_data")
    assert folder == tmp_path / "nltk_data" / "corpora" / "wordnet"
    assert reader.get_version() == "3.0"
    assert "automobile" in {lemma.name() for s in reader.synsets("car") for lemma in s.lemmas()}


def test_missing_files_name_the_packages(tmp_path):
    with pytest.raises(wordnet.WordNetMissing, match="wordnet-base and wordnet-sense-index"):
        wordnet.install(tmp_path / "nltk_data", tmp_path / "empty")
