"""The package list, found rather than written by hand: ``ppma/`` and its subpackages, and the
top-level ``kernels/`` folder installed as ``ppma.kernels`` (``package_dir`` in setup.cfg). All
other metadata lives in setup.cfg."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["ppma", "ppma.*"])
      + [f"ppma.{name}" for name in find_packages(include=["kernels", "kernels.*"])])
