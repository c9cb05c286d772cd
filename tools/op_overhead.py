#!/usr/bin/env python
"""``python tools/op_overhead.py --help``: the command line of :mod:`ppma.bench.op_overhead`, whose docstring is the usage
(also ``python -m ppma.bench.op_overhead``)."""
from ppma.bench.op_overhead import main

if __name__ == "__main__":
    main()
