#!/usr/bin/env python
"""``python tools/benchmark.py --help``: the command line of :mod:`ppma.bench.benchmark`, whose docstring is the usage
(also ``python -m ppma.bench.benchmark``)."""
from ppma.bench.benchmark import main

if __name__ == "__main__":
    main()
