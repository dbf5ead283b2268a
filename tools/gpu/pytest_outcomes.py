"""pytest plugin for device runs: every test's outcome and duration, and each failure's traceback, are appended to
files under ``$OUT`` as they happen, so a run stopped by a time limit still says what ran, what failed and what was
slow (``-p tools.gpu.pytest_outcomes``). With pytest-xdist the controller writes them (it receives every worker's
reports); the workers write nothing, so each test is listed once."""

import os


def _path(kind: str) -> str:
    return os.path.join(os.environ.get("OUT", "/tmp"), f"{kind}_{os.getpid()}.txt")


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when == "call" or report.failed or report.skipped:
        with open(_path("outcomes"), "a") as f:
            f.write(f"{report.outcome} {report.when} {report.duration:.1f}s {report.nodeid}\n")
    if report.failed:
        with open(_path("fails"), "a") as f:
            f.write(f"== {report.nodeid} {report.when}\n{report.longreprtext[-2500:]}\n\n")
