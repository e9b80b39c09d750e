"""The pipeline stages: each a typed ``run(params, force, progress)`` over store URIs that publishes a manifest."""
