"""The shared core: object storage, manifests, data contracts, config and the catalog of keys and paths.

Nothing here imports another wing of ``tasks``."""
