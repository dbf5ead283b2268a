"""Runs on a lent GPU host without a package index: the wheel bundle built from the project's extras (``bundle``,
``wheels``), the host-side script (``remote.sh``), kernels compiled ahead without a GPU (``aot_cuda``) and the pytest
plugin that logs outcomes as they happen (``pytest_outcomes``). See ``README.md`` beside this file."""
