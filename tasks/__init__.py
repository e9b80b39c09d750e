"""hpd-pipeline: Homomorphic Projective Distillation as auditable stages over object storage.

The package has four wings; imports flow one way, down this list:

- ``tasks.orchestration``: what the Airflow DAG files use (defaults, run context, DAG params);
- ``tasks.stages``: one module (or subpackage) per pipeline stage, and their light parameter models;
- ``tasks.ml``: model resolution, the encoder, the student, PCA projection, metrics, STS data;
- ``tasks.core``: storage, manifests, data contracts, config and the catalog of store keys and paths.

``tasks.cli`` (the ``hpd`` command) and ``tasks.demo`` sit on top.
"""
