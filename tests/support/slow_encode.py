"""Run encode_teacher with a pause before each shard is published, so a test can kill it mid-way.

Usage: python slow_encode.py STORE MODEL_DIR INGEST_DATE PAUSE_S
"""

import sys
import time

from tasks.core import config, parquet_shards
from tasks.stages import encode_teacher

store, model, day, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
publish = parquet_shards.write_shard


def slow_write_shard(*args, **kwargs):
    time.sleep(pause)
    return publish(*args, **kwargs)


parquet_shards.write_shard = slow_write_shard
params = config.parse(encode_teacher.EncodeTeacherParams, {"store": store, "teacher": model, "ingest_date": day})
encode_teacher.run(params)
