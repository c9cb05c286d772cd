"""The GPU report (``python tools/gpu_report.py``, docs/gpu.md).

One module per concern: :mod:`.budget` (the sections' time limits), :mod:`.correctness` (``auto``
against ``torch`` on whole models), :mod:`.kernel_tables` (the ``kernels/bench`` scripts),
:mod:`.throughput` (whole models), :mod:`.step_profile` (where a training step's time goes),
:mod:`.official` (official model files imported by path) and :mod:`.gpu_report` (the report).
"""
