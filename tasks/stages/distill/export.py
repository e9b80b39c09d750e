"""What a distillation run publishes: the sentence-transformers folder with its model card
(``model_card.md``, a template shipped with the package), the loss history and the metrics."""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from tasks.core import catalog, manifest, storage
from tasks.ml import onnx_encoder
from tasks.ml.student import MODEL_FOLDER
from tasks.stages.distill.trainer import Trainer
from tasks.stages.params import DistillParams


def run_summary(trainer: Trainer, init_record: dict[str, Any]) -> dict[str, Any]:
    """The run's stats: steps, rows, validation before / at the end / of the exported weights, set-up."""
    state = trainer.state
    return {
        "steps": state.step,
        "total_steps": trainer.plan.total_steps,
        "train_rows": trainer.data.train_rows,
        "val_rows": len(trainer.data.val_texts),
        "k": trainer.data.dim,
        "best_step": state.best_step,
        "best_val_mse": state.best_val_mse,
        "initial": state.evals[0].as_record() if state.evals else None,
        "final": state.evals[-1].as_record() if state.evals else None,
        "exported": trainer.exported,
        "stopped_early": state.stopped_early,
        "init": init_record,
        "amp": trainer.plan.amp,
        "world_size": trainer.dist.world,
    }


def files(trainer: Trainer, stage_run: manifest.StageRun, summary: dict[str, Any]) -> dict[str, bytes]:
    """The exported model folder (with model card, and the ONNX graph ``params.onnx`` asks for, whose record
    joins ``summary``), loss history and metrics, as URI -> bytes."""
    # A folder per run: a later run under the same name (with any flags) never overwrites what a manifest lists.
    prefix = catalog.student_prefix(stage_run.store, trainer.params.name, stage_run.run_id)
    exported: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / MODEL_FOLDER
        trainer.model.require_finite_weights(f"distill {trainer.params.name}: the weights to export")
        trainer.model.save(folder)
        onnx: onnx_encoder.OnnxExport | None = None
        if trainer.params.onnx != "none":
            onnx = onnx_encoder.export(trainer.model, folder, trainer.params.onnx)
            summary["onnx"] = onnx.as_record()
        (folder / "README.md").write_text(model_card(trainer.params, stage_run, summary, onnx))
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            exported[storage.join(prefix, MODEL_FOLDER, *path.relative_to(folder).parts)] = path.read_bytes()
    losses = "".join(json.dumps({"step": s, "loss": loss}) + "\n" for s, loss in trainer.state.losses)
    exported[storage.join(prefix, "losses.jsonl")] = losses.encode()
    metrics = {"evals": [evaluation.as_record() for evaluation in trainer.state.evals], **summary}
    exported[storage.join(prefix, "metrics.json")] = json.dumps(metrics, indent=2).encode()
    return exported


def model_card(
    params: DistillParams, stage_run: manifest.StageRun, summary: dict[str, Any], onnx: onnx_encoder.OnnxExport | None
) -> str:
    """The model card: what was distilled from what, how it trained, its configuration, ONNX graph and lineage."""
    template = Template(resources.files(__package__).joinpath("model_card.md").read_text(encoding="utf-8"))
    inputs = "\n".join(f"- `{i.uri}` (sha256 `{i.sha256[:12]}`)" for i in stage_run.inputs)
    return template.substitute(
        {
            key: summary[key]
            for key in (
                "k",
                "steps",
                "total_steps",
                "best_step",
                "stopped_early",
                "train_rows",
                "val_rows",
                "init",
                "initial",
                "final",
                "exported",
            )
        },
        name=params.name,
        student=params.student,
        warm_start=f" (warm-started from distill run `{params.warm_start}`)" if params.warm_start else "",
        teacher=params.teacher,
        pca_name=params.pca_name,
        layers=f"(first {params.student_layers} layers) " if params.student_layers else "",
        activation=params.activation,
        best_val_mse=f"{summary['best_val_mse']:.6g}",
        select_on=params.select_on,
        config=json.dumps(params.model_dump(mode="json"), indent=2),
        onnx=_onnx_note(onnx),
        run_id=stage_run.run_id,
        code_version=manifest.code_version(),
        inputs=inputs,
    )


def _onnx_note(onnx: onnx_encoder.OnnxExport | None) -> str:
    if onnx is None:
        return "None exported (`onnx: none`)."
    return (
        f"`{onnx.file}`: the whole encoder as one ONNX graph ({onnx.variant}; {onnx.asked} asked),"
        f" inputs `input_ids` and `attention_mask`, output `sentence_embedding`. STS dev: {onnx.sts_dev.as_record()}."
    )
