"""What the Airflow DAG files use: deployment defaults, the run context, and DAG params from the stages' params."""
