"""Measure the package on a GPU within a budget made to fit 6 minutes; write one Markdown report (docs/gpu.md).

    python tools/gpu_report.py [--quick] [--device cuda|cpu] [--output REPORT.md]
                               [--official-ppma DIR] [--official-mlla DIR] [--budget SECONDS]

The sections and options: ``python tools/gpu_report.py --help`` (:mod:`ppma.bench.gpu.gpu_report`).
"""
from ppma.bench.gpu.gpu_report import main

if __name__ == "__main__":
    main()
