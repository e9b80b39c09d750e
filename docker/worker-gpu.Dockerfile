# The distillation worker: the Airflow image on a CUDA host. The torch wheel the lock pins bundles the
# CUDA runtime, so the image only needs the NVIDIA container runtime and a GPU (compose: `gpus`,
# Kubernetes: the pod template in infra/helm). It serves the `gpu` queue (HPD_GPU_QUEUE).
# `base` is the Airflow image (docker/airflow.Dockerfile): compose passes the image its api-server service builds
# (additional_contexts); by hand:
#   docker build --build-context base=docker-image://hpd-pipeline/airflow:0.1.0 -f docker/worker-gpu.Dockerfile .
FROM base
ENV HPD_GPU_QUEUE=gpu \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
