"""great-expectations Data Docs of a quality run, made to open offline and published into the store.

GX renders a Data Docs site (an index, a page per expectation suite and one per validation result) into a
local folder (:func:`render`); its pages load bootstrap, jQuery, font-awesome and the like from CDNs.
:func:`render` then points each of those at the copy vendored in ``data_docs_assets/`` (its README names
the sources, versions and licences), written next to the pages under ``static/vendor/``; it drops the
vega scripts (they draw the charts of a few expectations, none of them in ``schemas/expectations``) and
mends GX's relative links to its own ``static/`` files. :func:`publish` writes the pages and exactly what
they load into the store through the stage run, each recorded in its manifest with its sha256: the folder
is self-contained, and opens offline from any copy of the store.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

from tasks.core import manifest, uris

VENDOR = "static/vendor"
# Every CDN URL the pages of GX 1.x load (great_expectations/render/view/templates), and the vendored file
# (below data_docs_assets/) that stands in for it; None drops the tag.
CDN: dict[str, str | None] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap-4.3.1/bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap-4.3.1/bootstrap.min.js",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        "bootstrap-dark-1.1.0/bootstrap-prefers-dark.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        "bootstrap-table-1.19.1/bootstrap-table.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        "bootstrap-table-1.19.1/bootstrap-table.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "bootstrap-table-1.19.1/bootstrap-table-filter-control.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        "bootstrap-table-1.19.0/bootstrap-table-filter-control.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "bootstrap-table-1.19.0/bootstrap-table-filter-control.min.css"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker-1.9.0/bootstrap-datepicker.min.css"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker-1.9.0/bootstrap-datepicker.min.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        "fontawesome-free-6.6.0/css/all.min.css"
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery-3.7.1/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.js-1.12.9/popper.min.js",
    "https://cdn.jsdelivr.net/npm/vega@5": None,
    "https://cdn.jsdelivr.net/npm/vega-lite@5": None,
    "https://cdn.jsdelivr.net/npm/vega-embed@6": None,
}
# GX's logo, served from its bucket, is also in the static/images/ GX copies into every site.
GX_WEB_ASSETS = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"

_REMOTE_TAG = re.compile(r'<(?:script|link|img)\b[^>]*?\b(?:src|href)="(https?://[^"]*)"[^>]*>(?:\s*</script>)?')
_INTEGRITY = re.compile(r'\s+(?:integrity|crossorigin)="[^"]*"')  # file:// pages cannot load with CORS
_STATIC = re.compile(r'\b((?:src|href)=")(?:\./|(?:\.\./)+)?static/')
_REMOTE_CSS_URL = re.compile(r"url\(\s*['\"]?https?://[^)]*\)")  # the dark-mode logo of the inlined styles
_LOADED = re.compile(r'<(?:script|link|img)\b[^>]*?\b(?:src|href)="([^"#?]+)[^"]*"')

log = logging.getLogger(__name__)


class DataDocsError(RuntimeError):
    """Data Docs that would not open offline: a page loads something not among the built files."""


def render(context: Any, validated: list[Any], site: Path) -> Path:
    """Render the Data Docs of the validation results ``validated`` (and of their suites) into the empty folder
    ``site`` with the GX ``context`` that stored them, then make them offline; returns ``site``."""
    name = f"hpd-{uuid.uuid4().hex[:12]}"
    context.add_data_docs_site(
        name,
        {
            "class_name": "SiteBuilder",
            "show_how_to_buttons": False,
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site)},
        },
    )
    suites = dict.fromkeys(v.expectation_suite_identifier for v in validated)
    try:
        context.build_data_docs(site_names=[name], resource_identifiers=[*validated, *suites])
    finally:
        context.delete_data_docs_site(name)
    make_offline(site)
    return site


def make_offline(site: Path) -> None:
    """Rewrite every page of ``site`` to load the vendored copies, written into ``site/static/vendor``."""
    with resources.as_file(resources.files(__package__).joinpath("data_docs_assets")) as assets:
        shutil.copytree(assets, site / VENDOR, dirs_exist_ok=True)
    for page in site.rglob("*.html"):
        up = "../" * (len(page.relative_to(site).parts) - 1)
        page.write_text(offline_page(page.read_text(encoding="utf-8"), up), encoding="utf-8")


def offline_page(html: str, up: str) -> str:
    """A page with what it loads from the web replaced by the vendored copies; ``up`` leads from the page's
    folder to the site's root (``../../``)."""

    def local(tag: re.Match[str]) -> str:
        url = tag.group(1)
        try:
            path = _local_path(url)
        except KeyError:
            log.warning("data docs: %s is not vendored; the page loads it from the web", url)
            return tag.group(0)
        return "" if path is None else _INTEGRITY.sub("", tag.group(0).replace(url, up + path))

    html = _STATIC.sub(lambda m: m.group(1) + up + "static/", html)  # GX's favicon links miss a level
    return _REMOTE_CSS_URL.sub("none", _REMOTE_TAG.sub(local, html))


def _local_path(url: str) -> str | None:
    """The site-relative path of the file standing in for ``url``; None: drop the tag; KeyError: not vendored."""
    if url.startswith(GX_WEB_ASSETS):
        return "static/images/" + url[len(GX_WEB_ASSETS) :].split("?")[0]
    vendored = CDN[url]
    return None if vendored is None else f"{VENDOR}/{vendored}"


def loaded(html: str) -> list[str]:
    """What a page loads (the src or href of its scripts, stylesheets, icons and images), as written."""
    return _LOADED.findall(html)


def files(site: Path) -> list[Path]:
    """The pages of ``site``, the vendored folder and every other file a page loads; :class:`DataDocsError`
    when a page loads something from the web or a file that is not there."""
    pages = sorted(site.rglob("*.html"))
    refs = [(page, ref) for page in pages for ref in loaded(page.read_text(encoding="utf-8"))]
    bad = [f"{page.relative_to(site)} loads {ref}" for page, ref in refs if "://" in ref]
    local = [(page, ref) for page, ref in refs if "://" not in ref and not ref.startswith("data:")]
    needed = {Path(os.path.normpath(page.parent / ref)) for page, ref in local}
    bad += [f"no file {path}" for path in needed if not (path.is_relative_to(site) and path.is_file())]
    if bad:
        raise DataDocsError(f"Data Docs in {site} would not open offline: {'; '.join(sorted(bad))}")
    vendored = {path for path in (site / VENDOR).rglob("*") if path.is_file()}
    return sorted(set(pages) | needed | vendored)


def publish(stage_run: manifest.StageRun, site: Path, prefix: str) -> str:
    """Write the Data Docs of ``site`` below the store URI ``prefix`` as outputs of ``stage_run``; returns the
    URI of their index page."""
    for path in files(site):
        stage_run.write_output(uris.join(prefix, path.relative_to(site).as_posix()), path.read_bytes())
    return uris.join(prefix, "index.html")
