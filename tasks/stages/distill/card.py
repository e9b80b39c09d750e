"""The exported model's card (``README.md`` in the model folder, from the template ``model_card.md``).

Its YAML front matter is Hugging Face / sentence-transformers card metadata (base model, licence, library,
pipeline, tags, the scores as ``model-index`` numbers), written by ``huggingface_hub``'s ``ModelCardData``;
its body gives the run in readable form: scores, training, parameters and lineage. Models are named by their
name or hub id and store objects by their key in the store, never by a local path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from tasks.core import catalog, manifest
from tasks.core.progress import format_duration
from tasks.ml import models, student, teachers
from tasks.ml.onnx_encoder import OnnxExport
from tasks.stages.distill.evaluation import Evaluation
from tasks.stages.distill.trainer import Trainer
from tasks.stages.params import DistillParams

TAGS = ["sentence-transformers", "sentence-similarity", "feature-extraction", "distillation", "hpd"]
UNKNOWN_LICENCE = "other"  # the Hub's word for a licence the card cannot name
LOSS_WINDOW = 10  # the training loss reported: the mean over the last this many steps
ROWS = {"validation": "held-out rows", "train": "training rows"}
HIDDEN_PARAMS = {"store", "name"}  # the store is named by keys in the lineage; the name is the card's title


@dataclass(frozen=True)
class Scores:
    """What the card reports of a run: the exported weights' evaluation and the others, and the training loss."""

    exported: Evaluation
    blend: float | None
    evaluations: list[tuple[str, Evaluation]]  # (which weights, evaluation), in the order trained
    training_loss: float | None

    @classmethod
    def of(cls, trainer: Trainer) -> Scores:
        """The scores of ``trainer``'s finished run."""
        state, record = trainer.state, trainer.exported or {}
        exported = Evaluation.from_record(record) if record else state.evals[-1]
        best = next((e for e in state.evals if e.step == state.best_step), None)
        picked = [("initial", state.evals[0]), ("best", best), ("last", state.evals[-1])]
        rows: list[tuple[str, Evaluation]] = []
        for which, evaluation in picked:
            if evaluation is not None and all(evaluation is not seen for _, seen in rows):
                rows.append((which, evaluation))
        blends = [Evaluation.from_record(r) for r in record.get("blends") or ()]
        rows += [(f"blend {e.blend:g} of the initial and last weights", e) for e in blends]
        last = [loss for _, loss in state.losses[-LOSS_WINDOW:]]
        loss = float(sum(last) / len(last)) if last else None
        return cls(exported, record.get("blend"), rows, loss)

    def model_index(self) -> list[Any]:
        """The ``model-index`` results: the exported weights' fidelity on the held-out rows, their STS dev score
        (0-1, as sentence-transformers reports Spearman), and the training loss; plain floats."""
        from huggingface_hub import EvalResult

        found = self.exported
        measured: list[tuple[str, str, str, float]] = [("validation", "mse", "validation MSE", found.val_mse)]
        if math.isfinite(found.val_cosine):
            measured.append(("validation", "cosine", "mean cosine", found.val_cosine))
        if self.training_loss is not None:
            loss_name = f"training MSE (mean of the last {LOSS_WINDOW} steps)"
            measured.append(("train", "loss", loss_name, self.training_loss))
        results = [
            EvalResult(
                task_type="feature-extraction",  # a Hub task: the embeddings, held to the projected targets
                task_name="Projected teacher embeddings",
                dataset_type="hpd-projected-targets",
                dataset_name=f"{ROWS[split]} (projected teacher targets)",
                dataset_split=split,
                metric_type=metric,
                metric_name=label,
                metric_value=float(value),
            )
            for split, metric, label, value in measured
        ]
        if found.sts_dev is not None:
            results.append(
                EvalResult(
                    task_type="sentence-similarity",
                    task_name="Semantic Textual Similarity",
                    dataset_type="sts-dev",
                    dataset_name="STS-B dev and SICK-R trial (mean)",
                    dataset_split="validation",
                    metric_type="spearman_cosine",
                    metric_value=round(float(found.sts_dev) / 100, 5),
                )
            )
        return results

    def table(self, select_on: str) -> str:
        """The validation of each weights evaluated, the exported ones marked."""
        lines = [
            "| weights | step | validation MSE | mean cosine | STS dev (Spearman x 100) |",
            "|---|---|---:|---:|---:|",
        ]
        for which, evaluation in self.evaluations:
            lines.append(_score_row(which, evaluation))
        chosen = f"blend {self.blend:g}" if self.blend is not None else f"the best by {select_on}"
        lines.append(_score_row(f"**exported** ({chosen})", self.exported))
        return "\n".join(lines)


def render(trainer: Trainer, stage_run: manifest.StageRun, onnx: OnnxExport | None, learned: list[str]) -> str:
    """The model card of ``trainer``'s run, published by ``stage_run``; ``learned``: the partitions its weights
    learned (ISO dates)."""
    params, scores = trainer.params, Scores.of(trainer)
    template = Template(resources.files(__package__).joinpath("model_card.md").read_text(encoding="utf-8"))
    return template.substitute(
        front_matter=front_matter(params, scores),
        name=params.name,
        k=trainer.data.dim,
        student=model_name(params.student),
        warm_start=f" (warm-started from distill run `{params.warm_start}`)" if params.warm_start else "",
        layers=f" (its first {params.student_layers} layers)" if params.student_layers else "",
        activation=params.activation,
        teacher=teacher_name(params.teacher, quote="`"),
        pca_name=params.pca_name,
        relation=relation_note(trainer),
        scores=scores.table(params.select_on),
        training=training_lines(trainer, stage_run, scores, learned),
        onnx=onnx_note(onnx),
        parameters=parameter_table(params),
        run_id=stage_run.run_id,
        code_version=manifest.code_version(),
        inputs=input_lines(stage_run),
    )


def relation_note(trainer: Trainer) -> str:
    """What the neighbourhood term followed, when the run carried the teacher's own embeddings for it."""
    return ", and the in-batch neighbourhoods of the teacher's own embeddings" if trainer.data.relation_dim else ""


def front_matter(params: DistillParams, scores: Scores) -> str:
    """The card's YAML metadata: base model, licence and language (as the base model's card states them),
    library, pipeline, tags and the scores as ``model-index`` results."""
    from huggingface_hub import ModelCardData

    base = base_card(params.student)
    data = ModelCardData(
        base_model=model_name(params.student),
        license=base.get("license") or UNKNOWN_LICENCE,
        language=base.get("language"),
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=TAGS,
        model_name=params.name,
        eval_results=scores.model_index(),
    )
    return data.to_yaml() + "\n"


def base_card(spec: str) -> dict[str, Any]:
    """The metadata of model ``spec``'s own card (its folder's ``README.md``), empty when it has none."""
    from huggingface_hub import metadata_load

    try:
        card = models.resolve(spec) / "README.md"
        return (metadata_load(card) or {}) if card.is_file() else {}
    except (models.ModelError, ValueError):
        return {}


def teacher_name(spec: str, quote: str = "") -> str:
    """How the card names a teacher spec: its members' :func:`model_name` joined by " + ", a weighted member's
    with its weight (``0.5 × all-MiniLM-L6-v2``)."""
    return " + ".join(
        f"{f'{weight:g} × ' if weight != 1 else ''}{quote}{model_name(model)}{quote}"
        for model, weight in teachers.weighted_members(spec)
    )


def model_name(spec: str) -> str:
    """How the card names model ``spec``: a packaged model by its hub id, a local folder by its name (never its
    path), a hub id as it is."""
    if spec in models.PACKAGED:
        return f"sentence-transformers/{spec}"
    path = Path(spec).expanduser()
    if path.is_absolute() or spec.startswith((".", "~")) or path.is_dir():
        return path.resolve().name
    return spec


def _score_row(which: str, evaluation: Evaluation) -> str:
    cosine = f"{evaluation.val_cosine:.3f}" if math.isfinite(evaluation.val_cosine) else "not measured"
    sts = "not measured" if evaluation.sts_dev is None else f"{evaluation.sts_dev:.2f}"
    return f"| {which} | {evaluation.step} | {evaluation.val_mse:.3g} | {cosine} | {sts} |"


def training_lines(trainer: Trainer, stage_run: manifest.StageRun, scores: Scores, learned: list[str]) -> str:
    """How the run trained, as a bullet list."""
    state, plan, data = trainer.state, trainer.plan, trainer.data
    stopped = " (stopped early: no better validation for `patience` evaluations)" if state.stopped_early else ""
    took = stage_run.timings_s.get("train")
    lines = [
        f"- {state.step:,} optimizer steps of {plan.total_steps:,} planned{stopped}; best weights at step"
        f" {state.best_step:,}",
        f"- {data.train_rows:,} training rows and {len(data.val_texts):,} held-out validation rows,"
        f" from the partitions {', '.join(learned) or 'none'}",
        f"- head initialisation: {student.head_note(trainer.init_record)}",
    ]
    if scores.training_loss is not None:
        lines.append(f"- training MSE, mean of the last {LOSS_WINDOW} steps: {scores.training_loss:.3g}")
    if took is not None:
        processes = "1 process" if trainer.dist.world == 1 else f"{trainer.dist.world} processes"
        lines.append(f"- training took {format_duration(took)} on {processes}")
    return "\n".join(lines)


def parameter_table(params: DistillParams) -> str:
    """Every parameter of the run (but the store, named in the lineage), its value and what it sets."""
    lines = ["| parameter | value | what it sets |", "|---|---|---|"]
    for name, field in DistillParams.model_fields.items():
        if name in HIDDEN_PARAMS:
            continue
        value = getattr(params, name)
        shown = teacher_name(value or "") if name in ("teacher", "student") else readable(value)
        lines.append(f"| `{name}` | {shown} | {(field.description or '').replace('|', '/')} |")
    return "\n".join(lines)


def readable(value: Any) -> str:
    """A parameter's value in words: lists joined, yes/no, not set; never a Python repr or a local path."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(readable(item) for item in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(("/", "~", "file://")):
        return model_name(value.removeprefix("file://"))
    return str(value)


def input_lines(stage_run: manifest.StageRun) -> str:
    """The run's inputs, each by its key in the store and checksum."""
    return "\n".join(
        f"- `{catalog.store_key(stage_run.store, i.uri) or readable(i.uri)}` (sha256 `{i.sha256[:12]}`)"
        for i in stage_run.inputs
    )


def onnx_note(onnx: OnnxExport | None) -> str:
    """The ONNX graph exported beside the model, or that none was."""
    if onnx is None:
        return "No ONNX graph exported (`onnx: none`)."
    scores = ", ".join(f"{name} {score:.2f}" for name, score in onnx.sts_dev.as_record().items())
    return (
        f"`{onnx.file}`: the whole encoder as one ONNX graph ({onnx.variant}; {onnx.asked} asked),"
        f" inputs `input_ids` and `attention_mask`, output `sentence_embedding`. STS dev: {scores}."
    )
