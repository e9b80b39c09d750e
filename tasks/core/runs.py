"""Model runs side by side (`hpd runs`): each distill run with its input partitions, its validation (STS,
fidelity, retrieval, gate) and whether ``models/current.json`` names it, listed newest first or two compared.

A run is read from its manifests only: ``manifests/distill/<run>.json`` and, when validated,
``manifests/validate/<run>.json``. A validation of an earlier distill of the same name (its recorded
input fingerprint is not the distill manifest's) is ``stale`` and its measurements are left out."""

from __future__ import annotations

from typing import Any

from tasks.core import catalog, manifest, partitions, promoted, storage, tables
from tasks.core.catalog import Stage
from tasks.core.stage_records import GATED, GateVerdict, Record, RecordError, ValidateStats

PASSED, FAILED, NOT_VALIDATED, STALE = "passed", "failed", "not validated", "stale"
MARK = "*"  # on a compared row that differs, and on the promoted run


class Validation(ValidateStats):
    """A validation as a run shows it: its STS table, retrieval and gate verdict, its params and phase timings."""

    params: dict[str, Any]
    timings: dict[str, float]


class _Published(Record):
    """What a run shows of a manifest's own fields: when it was published, how long each phase took."""

    ended_at: str
    timings_s: dict[str, float]


class Run(Record):
    """One model run as its manifests record it. ``created``: when its distill manifest was published;
    ``validation``: the validate manifest's (None unless ``gate`` is passed or failed); ``fidelity``: the exported
    weights' validation score, from distill."""

    name: str
    created: str
    partitions: list[str]
    promoted: bool
    gate: str
    params: dict[str, Any]
    fidelity: dict[str, Any] | None
    timings: dict[str, float]
    validation: Validation | None

    def to_dict(self) -> dict[str, Any]:
        """The run as read (a gate verdict from before the rules were recorded still without them)."""
        return self.model_dump(exclude_unset=True)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Run:
        return cls.model_validate(record)

    def student_score(self, pair_set: str) -> float | None:
        """The student's STS score on ``pair_set``, None when not validated."""
        return None if self.validation is None else self.validation.sts.student.get(pair_set)

    def compared(self) -> dict[str, Any]:
        """Everything compared about the run, by row name: params, inputs, metrics, gate, durations."""
        rows: dict[str, Any] = {
            "created": self.created,
            "promoted": self.promoted,
            **tables.flat("params", self.params),
        }
        rows |= {"partitions": self.partitions, **tables.flat("fidelity", self.fidelity), **self._validation_rows()}
        validate_timings = None if self.validation is None else self.validation.timings
        return rows | tables.flat("timings.distill", self.timings) | tables.flat("timings.validate", validate_timings)

    def _validation_rows(self) -> dict[str, Any]:
        """The student's STS scores and the gate's reference, retrieval, the gate, its margins and params."""
        if self.validation is None:
            return {"gate": self.gate}
        validation, gate = self.validation, self.validation.gate
        rows = tables.flat("sts.student", _gated_first(validation.sts.student))
        rows |= {"gate.reference": gate.reference, **tables.flat("sts.reference", _gated_first(gate.reference_scores))}
        rows |= {**tables.flat("retrieval", validation.retrieval.model_dump()), "gate": self.gate, **_margins(gate)}
        return rows | tables.flat("validate.params", validation.params)


def _validation(store: str, name: str, distilled: manifest.Manifest) -> tuple[str, Validation | None]:
    """The gate decision and the measurements of the validation of this very distill run, if any."""
    validated = manifest.read(store, Stage.VALIDATE, name)
    if validated is None:
        return NOT_VALIDATED, None
    # the run's version (or, for a validation from before versions, its key's latest)
    this_run = {distilled.version_uri(store), catalog.manifest_uri(store, Stage.DISTILL, name)}
    if not any(i.uri in this_run and i.sha256 == distilled.fingerprint for i in validated.inputs):
        return STALE, None
    uri = catalog.manifest_uri(store, Stage.VALIDATE, name)
    measured = ValidateStats.parse(validated.stats, f"the stats of {uri}")
    published = _Published.parse(validated.document, uri)
    record = Validation(
        sts=measured.sts,
        retrieval=measured.retrieval,
        gate=measured.gate,
        params=validated.params,
        timings=published.timings_s,
    )
    return PASSED if measured.gate.passed else FAILED, record


def read_run(store: str, name: str, promoted: str | None) -> Run:
    """The model run ``name`` of ``store`` (``promoted``: the run models/current.json names); an unknown run,
    or one whose manifests lack what a run shows, is a :class:`manifest.ManifestError` naming the manifest."""
    store = storage.to_uri(store)
    distilled = partitions.distill_manifest(store, name)
    try:
        gate, validation = _validation(store, name, distilled)
        published = _Published.parse(distilled.document, catalog.manifest_uri(store, Stage.DISTILL, name))
    except RecordError as exc:
        raise manifest.ManifestError(str(exc)) from None
    days = partitions.partitions_read(store, distilled)
    return Run(
        name=name,
        created=published.ended_at,
        partitions=[day.isoformat() for day in sorted(days)],
        promoted=name == promoted,
        gate=gate,
        params=distilled.params,
        fidelity=distilled.stats.get("exported"),
        timings=published.timings_s,
        validation=validation,
    )


def list_runs(store: str) -> list[Run]:
    """Every model run of ``store``, newest first."""
    current = promoted.model_run(store)
    found = [read_run(store, name, current) for name in manifest.list_keys(storage.to_uri(store), Stage.DISTILL)]
    return sorted(found, key=lambda run: (run.created, run.name), reverse=True)


# -- compare ------------------------------------------------------------------------------------------------
class Row(Record):
    """One compared value: its name, run A's and run B's (None where a run has none), whether they differ."""

    name: str
    a: Any
    b: Any
    differs: bool


class Comparison(Record):
    """Model runs ``a`` and ``b``, row by row."""

    a: str
    b: str
    rows: list[Row]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Comparison:
        return cls.model_validate(record)

    def render(self) -> str:
        """``name  A  B`` per row, the rows that differ marked ``*`` in front."""
        header = [" ", "", self.a, self.b]
        rows = [[MARK if r.differs else "", r.name, tables.shown(r.a), tables.shown(r.b)] for r in self.rows]
        return tables.table([header, *rows])


def _margins(gate: GateVerdict) -> dict[str, float]:
    """How far the student's score is above each gate rule's threshold (below when negative), as the validate
    stage recorded the rules (manifests from before it did show none)."""
    return {f"gate.margin.{rule.score}.{rule.rule}": round(rule.margin, 2) for rule in gate.rules}


def _gated_first(scores: dict[str, float]) -> dict[str, float]:
    """``scores`` by pair set, the gated ones first (STS-B test, SICK-R test)."""
    return {pair_set: scores[pair_set] for pair_set in GATED if pair_set in scores} | scores


def compare(store: str, a: str, b: str) -> Comparison:
    """Runs ``a`` and ``b`` side by side, row by row, the differing rows marked."""
    current = promoted.model_run(store)
    return compare_runs(read_run(store, a, current), read_run(store, b, current))


def compare_runs(a: Run, b: Run) -> Comparison:
    """Two runs as read (or, for a run being validated, as measured so far) side by side, row by row."""
    first, second = a.compared(), b.compared()
    names = list(first) + [name for name in second if name not in first]
    rows = [Row(name=n, a=first.get(n), b=second.get(n), differs=first.get(n) != second.get(n)) for n in names]
    return Comparison(a=a.name, b=b.name, rows=rows)


# -- rendering ----------------------------------------------------------------------------------------------
def render_list(runs: list[Run]) -> str:
    """One line per run: name, created, partitions, the student's gated scores, gate, ``*`` if promoted."""
    header = ["run", "created", "partitions", *GATED, "gate", "promoted"]
    lines = [
        [r.name, r.created[:19].replace("T", " "), ", ".join(r.partitions) or "-"]
        + [*(tables.shown(r.student_score(s)) for s in GATED), r.gate, MARK if r.promoted else ""]
        for r in runs
    ]
    return tables.table([header, *lines]) if runs else "no model runs"
