"""The one list of stages: each stage's name, parameter model, module and run function.

The CLI, the Airflow runtime, the docs and the architecture test read it. A stage's module is imported by
:func:`module`, on the stage's first run, so that listing the stages (``hpd --help``, a DAG file's parse)
loads neither torch, transformers nor FAISS; the imports are plain statements, which readers and tools see.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from tasks.core.catalog import Stage
from tasks.core.config import StageParams
from tasks.stages.params import (
    AugmentParams,
    BuildIndexParams,
    DistillParams,
    DriftParams,
    EncodeTeacherParams,
    FitPCAParams,
    GCParams,
    QualityParams,
    StageCorpusParams,
    ValidateParams,
)

if TYPE_CHECKING:  # the manifest module brings storage (boto3, pyarrow): not for `hpd --help`
    from tasks.core.manifest import StageResult

# The stages in the order a chain runs them; each one's parameter model.
STAGES: dict[Stage, type[StageParams]] = {
    Stage.STAGE_CORPUS: StageCorpusParams,
    Stage.AUGMENT: AugmentParams,
    Stage.ENCODE_TEACHER: EncodeTeacherParams,
    Stage.FIT_PCA: FitPCAParams,
    Stage.DISTILL: DistillParams,
    Stage.VALIDATE: ValidateParams,
    Stage.BUILD_INDEX: BuildIndexParams,
    Stage.QUALITY: QualityParams,
    Stage.DRIFT: DriftParams,
    Stage.GC: GCParams,
}


def module(stage: Stage) -> ModuleType:  # noqa: C901 - one branch a stage
    """The module of ``stage``, whose ``run(params, force, progress)`` runs it."""
    match stage:
        case Stage.STAGE_CORPUS:
            from tasks.stages import stage_corpus as module
        case Stage.AUGMENT:
            from tasks.stages import augment as module
        case Stage.ENCODE_TEACHER:
            from tasks.stages import encode_teacher as module
        case Stage.FIT_PCA:
            from tasks.stages import fit_pca as module
        case Stage.DISTILL:
            from tasks.stages import distill as module
        case Stage.VALIDATE:
            from tasks.stages import validate as module
        case Stage.BUILD_INDEX:
            from tasks.stages import build_index as module
        case Stage.QUALITY:
            from tasks.stages import quality as module
        case Stage.DRIFT:
            from tasks.stages import drift as module
        case Stage.GC:
            from tasks.stages import gc as module
        case _:
            raise ValueError(f"{stage}: not a stage that runs on its own (the stages: {', '.join(STAGES)})")
    return module


def run(stage: Stage, params: StageParams, force: bool = False, progress: bool = False) -> StageResult:
    """Run ``stage`` with validated parameters: skipped when its manifest matches, unless ``force``."""
    result: StageResult = module(stage).run(params, force=force, progress=progress)
    return result
