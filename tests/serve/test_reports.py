"""The report app (tasks/serve/reports.py) on a tiny store, on file:// and S3: a validation's report, card and
metrics and a quality run's Data Docs are served verified and under the page policy, the report's relative link
reaches the Data Docs, and nothing else is: no object outside the report keys, none a manifest does not list, none
of a replaced run, no store not served, no altered bytes, no reader the guard refuses. The report opens in
Chromium with its title and plots. (The same app in Airflow's API server: tests/dags/test_airflow_services.py.)"""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest
from fastapi import Header, HTTPException
from fastapi.testclient import TestClient

from tasks.core import catalog, config, manifest, storage
from tasks.core import reports as report_objects
from tasks.core.catalog import Stage
from tasks.serve import reports
from tasks.stages import quality, validate
from tests.support import chromium, store_state
from tests.support.projected_store import PCA_NAME, corpus_lines, distill_tiny, projected_store
from tests.support.servers import serving

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A store with a validated tiny student 'tiny' and two quality runs of the partition (the first replaced);
    the keys of their report objects."""
    prepared = projected_store(tmp_path_factory.mktemp("reports"), corpus_lines(60), DAY, shard_rows=60)
    store = prepared["store"]
    distill_tiny(prepared, "tiny", max_steps=1)
    checks = {"store": store, "ingest_date": DAY, "teacher": prepared["teacher"], "pca_name": PCA_NAME}
    replaced = quality.run(config.parse(quality.QualityParams, checks))
    current = quality.run(config.parse(quality.QualityParams, checks), force=True)
    values = {"store": store, "model_run": "tiny", "retrieval_sample": 20, "max_regression": 100.0}
    validated = validate.run(config.parse(validate.ValidateParams, values))
    keys = {o.name: catalog.store_key(store, o.uri) for o in validated.outputs}
    docs = [catalog.store_key(store, o.uri) for o in current.outputs if "/data_docs/" in o.uri]
    old_docs = [catalog.store_key(store, o.uri) for o in replaced.outputs if o.uri.endswith("/index.html")]
    return {"folder": Path(store.removeprefix("file://")), "keys": keys, "docs": docs, "replaced": old_docs[0]}


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, built, tmp_path) -> str:
    """A copy of the built store, in a folder or a bucket (each test may alter its own)."""
    if request.param == "file":
        shutil.copytree(built["folder"], tmp_path / "store")
        return storage.to_uri(str(tmp_path / "store"))
    store = f"s3://{request.getfixturevalue('s3_bucket')}/root"
    store_state.copy_into(built["folder"], store)
    return store


def _reader(x_reader: str = Header("")) -> None:
    if x_reader != "allowed":
        raise HTTPException(403, "not allowed")


def _client(*stores: str) -> TestClient:
    app = reports.reports_app(lambda: list(stores), lambda kind: [_reader])
    return TestClient(app, headers={"X-Reader": "allowed"})


def _address(store: str, key: str) -> str:
    return f"/{report_objects.store_id(store)}/{key}"


def test_the_report_objects_are_served_under_the_page_policy(built, store):
    client = _client(store)
    report = client.get(_address(store, built["keys"]["report.html"]))
    assert report.status_code == 200 and report.headers["content-type"] == "text/html; charset=utf-8"
    assert "<title>Validation of tiny</title>" in report.text
    assert report.headers["content-security-policy"] == reports.PAGE_POLICY
    assert client.get(_address(store, built["docs"][0])).headers["content-security-policy"] == reports.DATA_DOCS_POLICY
    assert report.headers["x-content-type-options"] == "nosniff"
    card = client.get(_address(store, built["keys"]["model_card.md"]))
    assert card.status_code == 200 and "<title>Model card: tiny</title>" in card.text and "<table>" in card.text
    metrics = client.get(_address(store, built["keys"]["metrics.json"]))
    assert metrics.headers["content-type"] == "application/json" and "sts" in metrics.json()
    for key in built["docs"]:
        assert client.get(_address(store, key)).status_code == 200, key
    assert report_objects.report_path(
        catalog.resolve(store, built["keys"]["report.html"])
    ) == report_objects.PREFIX + _address(store, built["keys"]["report.html"])


def test_the_reports_relative_link_reaches_the_data_docs(built, store):
    client = _client(store)
    address = _address(store, built["keys"]["report.html"])
    page = client.get(address).text
    (href,) = {h for h in _hrefs(page) if "data_docs/index.html" in h}
    docs = client.get(_joined(address, href))
    assert docs.status_code == 200 and "<html" in docs.text


def test_nothing_but_listed_report_objects_is_served(built, store):
    client, report = _client(store), built["keys"]["report.html"]
    run_folder = report.rsplit("/", 1)[0]
    storage.write_bytes(catalog.resolve(store, f"{run_folder}/notes.html"), b"<p>planted</p>")
    docs_folder = built["docs"][0].split("/data_docs/")[0] + "/data_docs"
    storage.write_bytes(catalog.resolve(store, f"{docs_folder}/planted.html"), b"<p>planted</p>")
    refused = {
        catalog.manifest_uri(store, Stage.VALIDATE, "tiny").split(store + "/")[1]: 404,  # not a report key
        f"{run_folder}/notes.html": 404,  # beside the report, not a report name
        f"{docs_folder}/planted.html": 404,  # a report key no manifest lists
        built["replaced"]: 404,  # the Data Docs of a replaced quality run
        report.replace("validation/tiny/", "validation/other/"): 404,
        f"validation/tiny/%2e%2e/%2e%2e/{report}": 404,
        built["replaced"].replace(DAY.isoformat(), "2026-13-45"): 404,  # shaped like a partition, no date
    }
    for key, status in refused.items():
        answer = client.get(_address(store, key))
        assert answer.status_code == status, (key, answer.status_code, answer.text)
    assert "no manifest of this store lists it" in client.get(_address(store, f"{docs_folder}/planted.html")).text
    assert client.get(f"/{report_objects.store_id('file:///elsewhere')}/{report}").status_code == 404
    assert client.get(_address(store, report), headers={"X-Reader": "someone"}).status_code == 403


def test_an_altered_report_is_refused_naming_it(built, store):
    uri = catalog.resolve(store, built["keys"]["report.html"])
    body = storage.read_bytes(uri)
    storage.write_bytes(uri, body.replace(b"Validation of tiny", b"Validation of evil"))
    answer = _client(store).get(_address(store, built["keys"]["report.html"]))
    assert answer.status_code == 502
    assert answer.json()["detail"].startswith(f"{built['keys']['report.html']}: does not verify against its manifest")
    assert manifest.read(store, Stage.VALIDATE, "tiny") is not None  # nothing else changed


@pytest.mark.services
def test_the_report_opens_in_chromium_with_its_title_and_plots(built, store, tmp_path):
    app = reports.reports_app(lambda: [store], lambda kind: [])
    with serving(app) as url:
        visit = chromium.Visit(offline=False)
        address = url + _address(store, built["keys"]["report.html"])
        page = chromium.load(address, tmp_path / "profile", visit=visit)
    fetched = {u for u in page.requested.values() if not u.startswith("data:")}
    assert not page.failed and fetched <= {address, f"{url}/favicon.ico"}  # its plots are inline
    assert page.title == "Validation of tiny" and page.images >= 1


def _hrefs(page: str) -> list[str]:
    import re

    return re.findall(r'href="([^"]+)"', page)


def _joined(address: str, href: str) -> str:
    import posixpath

    return posixpath.normpath(posixpath.join(posixpath.dirname(address), href))


def test_a_buttons_address_keeps_the_api_servers_base_path_and_is_none_for_other_objects(monkeypatch):
    from tasks.orchestration.defaults import report_url

    report = "s3://bucket/store/validation/tiny/" + "0" * 32 + "/report.html"
    served = f"{report_objects.PREFIX}/{report_objects.store_id('s3://bucket/store')}/validation/tiny/{'0' * 32}"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")
    assert report_url(report) == f"/team-a{served}/report.html"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    assert report_url(report) == f"{served}/report.html"
    assert report_url("s3://bucket/store/manifests/validate/tiny.json") == ""
    assert report_url("s3://bucket/store/validation/tiny/" + "0" * 32 + "/notes.html") == ""
