"""Store URIs: ``join`` never leaves its base, ``contained`` keeps URIs read from manifests, pointers and
archives below the store root, ``to_uri`` normalises ``file://`` paths."""

from __future__ import annotations

import pytest

from tasks.core.uris import StorageError, contained, join, to_uri

ROOTS = ["file:///data/store", "s3://bucket/root"]


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("parts", [("..",), ("a", ".."), ("../x",), ("a/../../x",), (".",), ("a/./b",), ("x", "/../")])
def test_join_refuses_dot_segments(root, parts):
    with pytest.raises(StorageError, match="'.' and '..' path segments are not allowed") as err:
        join(root, *parts)
    assert err.value.uri.startswith(root + "/")


@pytest.mark.parametrize("root", ROOTS)
def test_join_keeps_names_with_dots_that_are_not_dot_segments(root):
    assert join(root, "run.v2", "a..b", "...") == f"{root}/run.v2/a..b/..."
    assert join(root + "/", "/a/", "b/c.json") == f"{root}/a/b/c.json"


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("below", ["a", "a/b/c.json", "students/run/0123/model/modules.json"])
def test_contained_accepts_uris_below_the_root(root, below):
    assert contained(root, f"{root}/{below}") == f"{root}/{below}"
    assert contained(root + "/", f"{root}/{below}") == f"{root}/{below}"


@pytest.mark.parametrize(
    "uri",
    [
        "file:///data/store",  # the root itself is no object below it
        "file:///data/store-other/x",  # a sibling sharing the root's name as a prefix
        "file:///data/x",
        "file:///data/store/../x",  # normalised: file:///data/x
        "file:///data/store/a/../../x",
        "file:///etc/passwd",
        "s3://bucket/root/x",  # another scheme
    ],
)
def test_contained_refuses_file_uris_outside(uri):
    with pytest.raises(StorageError, match="outside the store file:///data/store") as err:
        contained("file:///data/store", uri)
    assert err.value.uri == uri


def test_contained_normalises_file_uris_that_stay_inside():
    assert contained("file:///data/store", "file:///data/store/a/../b/./c.json") == "file:///data/store/b/c.json"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/root/../x",
        "s3://bucket/root/a/../b",  # even where it would stay inside: S3 keys are not paths
        "s3://bucket/root/./x",
        "s3://bucket/root/students/r/model/../../evil.txt",
    ],
)
def test_contained_refuses_s3_dot_segments(uri):
    with pytest.raises(StorageError, match="'.' and '..' path segments are not allowed") as err:
        contained("s3://bucket/root", uri)
    assert err.value.uri == uri


@pytest.mark.parametrize("uri", ["s3://bucket/rootless/x", "s3://other/root/x", "s3://bucket/root", "file:///root/x"])
def test_contained_refuses_s3_uris_outside(uri):
    with pytest.raises(StorageError, match="outside the store s3://bucket/root"):
        contained("s3://bucket/root", uri)


def test_to_uri_normalises_file_dot_segments():
    assert to_uri("file:///data/store/../x") == "file:///data/x"
    assert to_uri("file:///data/store/./a//b/") == "file:///data/store/a/b"
    assert to_uri("file://localhost/data/store/../x") == "file:///data/x"
    assert to_uri("/data/store/../../../x") == "file:///x"
    assert to_uri("s3://bucket/a/../b/") == "s3://bucket/a/../b"  # S3 keys are kept as written
