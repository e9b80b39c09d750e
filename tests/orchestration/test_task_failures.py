"""Which errors fail a task at once and which keep its retries: every task's retry policy
(:class:`tasks.orchestration.defaults.FailPermanentErrors`) on errors the real components raise, and every error class
defined in ``tasks/`` classified. Through Airflow: tests/dags/test_task_failures.py."""

from __future__ import annotations

import ast
import builtins
import socket
from importlib import import_module

import pytest
from airflow.sdk import RetryAction
from airflow.sdk.exceptions import AirflowFailException

from tasks.core import config, storage
from tasks.orchestration import runtime
from tasks.orchestration.defaults import PERMANENT_ERRORS, TRANSIENT_ERRORS, FailPermanentErrors, error_kind
from tests.support.paths import REPO

POLICY = FailPermanentErrors()
# The packages whose errors the stages raise (the runtime's own are Airflow's fail-at-once and skip exceptions).
RAISING = ("core", "ml", "stages")


def _action(error: BaseException) -> RetryAction:
    return POLICY.evaluate(error, try_number=1, max_tries=3).action


def test_bad_params_fail_at_once():
    from tasks.stages.params import FitPCAParams

    with pytest.raises(config.ConfigError) as bad:
        config.parse(FitPCAParams, {"store": "file:///tmp/s", "teacher": "t", "k": 0})
    assert _action(bad.value) is RetryAction.FAIL


def test_a_failed_gate_fails_at_once():
    """A failed gate raises Airflow's own fail-at-once exception, which Airflow never retries (nor asks the policy)."""
    assert issubclass(runtime.QualityGateFailed, AirflowFailException)


def test_an_unreachable_store_is_retried(monkeypatch):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HPD_S3_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with pytest.raises(storage.StorageError) as unreachable:
        storage.read_bytes("s3://hpd-test/manifests/x.json")
    assert "cannot reach the S3 endpoint" in str(unreachable.value)
    decision = POLICY.evaluate(unreachable.value, try_number=1, max_tries=3)
    assert decision.action is RetryAction.RETRY and decision.reason == "StorageError is transient"


def test_the_nearest_listed_class_decides():
    from tasks.core.manifest import ConcurrentPublish, ManifestError
    from tasks.core.storage.objects import IntegrityError, ObjectNotFound
    from tasks.stages.build_index import PromotionConflict, RecallTooLow

    assert _action(IntegrityError("file:///s/a", "aa", "bb")) is RetryAction.FAIL  # a StorageError, but altered
    assert _action(ObjectNotFound("file:///s/a", "missing")) is RetryAction.RETRY
    assert _action(PromotionConflict("moved by another rebuild")) is RetryAction.RETRY  # an IndexBuildError, a race
    assert _action(RecallTooLow("recall 0.5 < 0.9")) is RetryAction.FAIL
    assert _action(ManifestError("not a manifest")) is RetryAction.FAIL
    assert _action(ConcurrentPublish("another run published other work first")) is RetryAction.RETRY  # a race
    assert _action(KeyError("x")) is RetryAction.DEFAULT and error_kind(OSError("reset")) is None


def _defined_classes() -> dict[str, list[str]]:
    """Every class defined in the :data:`RAISING` packages (by dotted name) with the names of its bases as written."""
    found = {}
    for path in sorted(p for package in RAISING for p in (REPO / "tasks" / package).rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
    return found


def test_every_error_class_in_tasks_is_classified():
    """A new error class of the stages must say whether another try could mend it: listed, or a listed class's
    subclass."""
    defined = _defined_classes()
    by_name = {name.rsplit(".", 1)[-1]: name for name in defined}

    def ancestry(name: str) -> list[str]:
        """``name`` and the classes of tasks/ it inherits from."""
        bases = [by_name[b] for b in defined[name] if b in by_name and by_name[b] != name]
        return [name, *(a for base in bases for a in ancestry(base))]

    def builtin_error(base: str) -> bool:
        kind = getattr(builtins, base, None)
        return isinstance(kind, type) and issubclass(kind, BaseException)

    errors = [name for name in defined if any(builtin_error(b) for a in ancestry(name) for b in defined[a])]
    listed = PERMANENT_ERRORS | TRANSIENT_ERRORS
    assert len(errors) > 25
    assert [n for n in errors if not set(ancestry(n)) & listed] == []


@pytest.mark.parametrize("name", sorted(PERMANENT_ERRORS | TRANSIENT_ERRORS))
def test_each_listed_class_is_defined_where_it_says(name):
    """The policy matches an error's classes by where they are defined, not where they are imported from."""
    module, _, attribute = name.rpartition(".")
    cls = getattr(import_module(module), attribute)
    assert issubclass(cls, BaseException) and f"{cls.__module__}.{cls.__qualname__}" == name
