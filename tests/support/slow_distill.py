"""Run distill with a pause after each checkpoint, so a test can kill it between checkpoints.

Usage: python slow_distill.py PARAMS_JSON
"""

import json
import sys
import time

from tasks.core import config
from tasks.stages import distill

save = distill.Trainer.save_checkpoint


def slow_save(self):
    save(self)
    time.sleep(0.5)


distill.Trainer.save_checkpoint = slow_save
distill.run(config.parse(distill.DistillParams, json.loads(sys.argv[1])))
