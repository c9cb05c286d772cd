#!/usr/bin/env python
"""``python tools/profile_models.py --help``: the command line of :mod:`ppma.bench.profile_models`, whose docstring is the usage
(also ``python -m ppma.bench.profile_models``)."""
from ppma.bench.profile_models import main

if __name__ == "__main__":
    main()
