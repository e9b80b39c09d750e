"""Validate: measure a distilled student, decide whether it may ship, and promote it if so.

Metrics (all in the manifest and ``validation/<run>/<fingerprint12>/metrics.json``): STS on STS-B
test, SICK-R test and any pair file given by URI (:mod:`.pairs`) for the teacher, the teacher + PCA,
the student and the same-size baseline; distillation fidelity from the distill run; retrieval
(:mod:`.scoring`). The quality gate (:mod:`.promotion`) decides, with every reason recorded; the
report (:mod:`.report`) is one offline HTML file; a passing model moves ``models/current.json``.
"""

from tasks.stages.params import ValidateParams
from tasks.stages.validate.errors import ValidateError
from tasks.stages.validate.pairs import read_pairs
from tasks.stages.validate.promotion import GATED
from tasks.stages.validate.stage import run

__all__ = ["GATED", "ValidateParams", "ValidateError", "read_pairs", "run"]
