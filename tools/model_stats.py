#!/usr/bin/env python
"""``python tools/model_stats.py --help``: the command line of :mod:`ppma.bench.model_stats`, whose docstring is the usage
(also ``python -m ppma.bench.model_stats``)."""
from ppma.bench.model_stats import main

if __name__ == "__main__":
    main()
