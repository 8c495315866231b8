"""One LNC's kernel checks on a NeuronCore, in a process of its own (the runtime reads
``NEURON_LOGICAL_NC_CONFIG`` once, at start). Prints one JSON list on its last line.

    NEURON_LOGICAL_NC_CONFIG=2 python -m trnfrontier.doctor.kernel_worker '{"rows": ...}'
"""

from __future__ import annotations

import json
import os
import sys

from .kernel_cases import Shapes
from .kernel_checks import neuron_results


def main(argv: list[str]) -> int:
    shapes = Shapes(**json.loads(argv[0]))
    lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
    sys.stdout.write(json.dumps(neuron_results(shapes, lnc)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
