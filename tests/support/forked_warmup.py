"""Imported by a process that forks runs of the pipeline (the forkserver of :mod:`tests.support.chaos`, the zygote
of :mod:`tests.support.warm_cli`), so that no child loads these again: the tasks' libraries but Airflow's (Airflow
reads its configuration at import), the tiny models' architecture (BERT), and botocore's data files (parsed as the
first S3 client is made; later clients of any settings share them). Nothing here runs a torch operation or starts a
thread, so forking after it is safe."""

import importlib

from tasks.core import storage
from tasks.orchestration.task_libraries import TASK_LIBRARIES

LIBRARIES = (
    *(name for name in TASK_LIBRARIES if not name.startswith("airflow")),
    "transformers.models.bert.modeling_bert",
)

for _library in LIBRARIES:
    importlib.import_module(_library)
storage.s3_client()
