"""Each NKI kernel's custom op against its plain PyTorch reference, measured in the same run.

    python benchmarks/bench_kernels.py [--device auto|cpu|cuda|neuron] [--repeats 5]

Prints one JSON document: the machine, then one row per kernel from
``trnfrontier.runtime.kernels.bench.benchmark_kernels`` (median ms of the ``trnf::`` op
and of the reference, ``speedup`` = reference / op, achieved GB/s or TFLOP/s and the
share of the device's peak). ``impl`` says what the op actually ran: ``nki`` only on a
NeuronCore with the ``nki`` package; elsewhere ``reference``, so the ratio then measures
the custom-op overhead, not a kernel.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trnfrontier.runtime import devices  # noqa: E402
from trnfrontier.runtime.kernels.bench import benchmark_kernels  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = devices.resolve_device(args.device)
    rows = benchmark_kernels(device, repeats=args.repeats)
    print(
        json.dumps(
            {
                "machine": {
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "device": devices.device_name(device),
                    "threads": torch.get_num_threads(),
                },
                "kernels": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
