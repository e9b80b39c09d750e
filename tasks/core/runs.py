"""Model runs side by side (`hpd runs`): each distill run with its input partitions, its validation (STS,
fidelity, retrieval, gate) and whether ``models/current.json`` names it, listed newest first or two compared.

A run is read from its manifests only: ``manifests/distill/<run>.json`` and, when validated,
``manifests/validate/<run>.json``. A validation of an earlier distill of the same name (its recorded
input fingerprint is not the distill manifest's) is ``stale`` and its measurements are left out."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tasks.core import catalog, lineage, manifest, storage
from tasks.core.catalog import Pointer, Stage

GATED = ("STS-B test", "SICK-R test")  # the pair sets the validate gate checks, as in its report
PASSED, FAILED, NOT_VALIDATED, STALE = "passed", "failed", "not validated", "stale"
MARK = "*"  # on a compared row that differs, and on the promoted run


@dataclass(frozen=True)
class Run:
    """One model run as its manifests record it. ``created``: when its distill manifest was published;
    ``validation``: the validate manifest's params, STS table, retrieval, gate and timings (None unless
    ``gate`` is passed or failed); ``fidelity``: the exported weights' validation score, from distill."""

    name: str
    created: str
    partitions: list[str]
    promoted: bool
    gate: str
    params: dict[str, Any]
    fidelity: dict[str, Any] | None
    timings: dict[str, float]
    validation: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Run:
        return cls(**record)

    def student_score(self, pair_set: str) -> float | None:
        """The student's STS score on ``pair_set``, None when not validated."""
        return None if self.validation is None else self.validation["sts"].get("student", {}).get(pair_set)


def _validation(store: str, name: str, distilled: manifest.Manifest) -> tuple[str, dict[str, Any] | None]:
    """The gate decision and the measurements of the validation of this very distill run, if any."""
    validated = manifest.read(store, Stage.VALIDATE, name)
    if validated is None:
        return NOT_VALIDATED, None
    distill_uri = catalog.manifest_uri(store, Stage.DISTILL, name)
    if not any(i.uri == distill_uri and i.sha256 == distilled.fingerprint for i in validated.inputs):
        return STALE, None
    record: dict[str, Any] = {part: validated.stats.get(part) for part in ("sts", "retrieval", "gate")}
    if not all(isinstance(value, dict) for value in record.values()):
        raise manifest.ManifestError(
            f"{catalog.manifest_uri(store, Stage.VALIDATE, name)}: its stats lack the sts, retrieval or gate record"
        )
    record |= {"params": validated.params, "timings": validated.document["timings_s"]}
    return PASSED if record["gate"]["passed"] else FAILED, record


def read_run(store: str, name: str, promoted: str | None) -> Run:
    """The model run ``name`` of ``store`` (``promoted``: the run models/current.json names); an unknown run
    is a :class:`manifest.ManifestError` naming its distill manifest."""
    store = storage.to_uri(store)
    distilled = lineage.distill_manifest(store, name)
    gate, validation = _validation(store, name, distilled)
    days = lineage.partitions_read(store, distilled)
    return Run(
        name=name,
        created=distilled.document["ended_at"],
        partitions=[day.isoformat() for day in sorted(days)],
        promoted=name == promoted,
        gate=gate,
        params=distilled.params,
        fidelity=distilled.stats.get("exported"),
        timings=distilled.document["timings_s"],
        validation=validation,
    )


def promoted_run(store: str) -> str | None:
    """The model run ``models/current.json`` names, None while nothing is promoted."""
    pointer, _ = catalog.read_pointer(storage.to_uri(store), Pointer.MODEL)
    return None if pointer is None else pointer.model_run


def list_runs(store: str) -> list[Run]:
    """Every model run of ``store``, newest first."""
    promoted = promoted_run(store)
    found = [read_run(store, name, promoted) for name in manifest.list_keys(storage.to_uri(store), Stage.DISTILL)]
    return sorted(found, key=lambda run: (run.created, run.name), reverse=True)


# -- compare ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One compared value: its name, run A's and run B's (None where a run has none), whether they differ."""

    name: str
    a: Any
    b: Any
    differs: bool


@dataclass(frozen=True)
class Comparison:
    """Model runs ``a`` and ``b``, row by row."""

    a: str
    b: str
    rows: list[Row]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Comparison:
        return cls(record["a"], record["b"], [Row(**row) for row in record["rows"]])


def _flat(prefix: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """``values`` as ``prefix.name`` rows, nested dicts flattened the same way."""
    rows: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if isinstance(value, dict):
            rows |= _flat(f"{prefix}.{name}", value)
        else:
            rows[f"{prefix}.{name}"] = value
    return rows


def _margins(gate: dict[str, Any]) -> dict[str, float]:
    """How far the student's score is above each gate rule's threshold (below when negative), as the validate
    stage recorded the rules (manifests from before it did show none)."""
    return {
        f"gate.margin.{rule['score']}.{rule['rule']}": round(rule["value"] - rule["threshold"], 2)
        for rule in gate.get("rules", [])
    }


def _gated_first(scores: dict[str, float]) -> dict[str, float]:
    """``scores`` by pair set, the gated ones first (STS-B test, SICK-R test)."""
    return {pair_set: scores[pair_set] for pair_set in GATED if pair_set in scores} | scores


def _validation_rows(run: Run) -> dict[str, Any]:
    """The student's STS scores and the gate's reference, retrieval, the gate, its margins and params."""
    if run.validation is None:
        return {"gate": run.gate}
    validation, gate = run.validation, run.validation["gate"]
    rows = _flat("sts.student", _gated_first(validation["sts"].get("student", {})))
    rows |= {"gate.reference": gate["reference"], **_flat("sts.reference", _gated_first(gate["reference_scores"]))}
    rows |= {**_flat("retrieval", validation["retrieval"]), "gate": run.gate, **_margins(gate)}
    return rows | _flat("validate.params", validation["params"])


def _rows(run: Run) -> dict[str, Any]:
    """Everything compared about ``run``, by row name: params, inputs, metrics, gate, durations."""
    rows: dict[str, Any] = {"created": run.created, "promoted": run.promoted, **_flat("params", run.params)}
    rows |= {"partitions": run.partitions, **_flat("fidelity", run.fidelity), **_validation_rows(run)}
    validate_timings = None if run.validation is None else run.validation["timings"]
    return rows | _flat("timings.distill", run.timings) | _flat("timings.validate", validate_timings)


def compare(store: str, a: str, b: str) -> Comparison:
    """Runs ``a`` and ``b`` side by side, row by row, the differing rows marked."""
    promoted = promoted_run(store)
    return compare_runs(read_run(store, a, promoted), read_run(store, b, promoted))


def compare_runs(a: Run, b: Run) -> Comparison:
    """Two runs as read (or, for a run being validated, as measured so far) side by side, row by row."""
    first, second = _rows(a), _rows(b)
    names = list(first) + [name for name in second if name not in first]
    rows = [Row(n, first.get(n), second.get(n), first.get(n) != second.get(n)) for n in names]
    return Comparison(a.name, b.name, rows)


# -- rendering ----------------------------------------------------------------------------------------------
def _shown(value: Any) -> str:
    """A value as a table cell: ``-`` for none, floats to 6 significant digits, lists comma-separated."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, list):
        return ", ".join(_shown(v) for v in value) or "[]"
    return str(value)


def _table(rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def render_list(runs: list[Run]) -> str:
    """One line per run: name, created, partitions, the student's gated scores, gate, ``*`` if promoted."""
    header = ["run", "created", "partitions", *GATED, "gate", "promoted"]
    lines = [
        [r.name, r.created[:19].replace("T", " "), ", ".join(r.partitions) or "-"]
        + [*(_shown(r.student_score(s)) for s in GATED), r.gate, MARK if r.promoted else ""]
        for r in runs
    ]
    return _table([header, *lines]) if runs else "no model runs"


def render_comparison(comparison: Comparison) -> str:
    """``name  A  B`` per row, the rows that differ marked ``*`` in front."""
    header = [" ", "", comparison.a, comparison.b]
    rows = [[MARK if r.differs else "", r.name, _shown(r.a), _shown(r.b)] for r in comparison.rows]
    return _table([header, *rows])
