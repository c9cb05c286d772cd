"""Shared memory, registers and spills of every Triton kernel configuration on every supported
architecture, without a GPU (:mod:`ppma.kernels.common.resources`).

    python tools/kernel_resources.py [--jobs N] [--full]   # recompile the rows whose kernel or case changed
    python tools/kernel_resources.py --rows NAME [NAME ...] --archs 90   # print, write nothing
"""
import os

os.environ.pop("TRITON_INTERPRET", None)  # the interpreter replaces @triton.jit at import time

from ppma.kernels.common.resources import main

if __name__ == "__main__":
    main()
