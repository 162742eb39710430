"""Package layout only (metadata lives in pyproject.toml): the top-level ``cli/`` folder installs as ``prunefx.cli``.

pyproject's ``packages.find`` cannot map a folder into another package, so the list is built here.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["prunefx", "prunefx.*"]), "prunefx.cli"], package_dir={"prunefx.cli": "cli"})
