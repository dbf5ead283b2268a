"""Runs ``warp-meshad`` (its ``main``) in this process with one fault injected at the file level, for the
subprocess tests of tests/test_faults.py:

    python tests/fault_driver.py --enospc-on NAME -- run cloth/hanging ...
        the first write to a file whose name contains ``NAME`` (an output's temporary name, e.g. ``.final.``) writes
        half of its bytes, then fails with ENOSPC, as on a full disk;
    python tests/fault_driver.py --signal-on NAME --signal INT|TERM -- run ...
        opening a file whose path contains ``NAME`` for writing sends the signal (INT: to the whole process group,
        as Ctrl-C in a terminal does; TERM: to this process), then the open goes on.

Files are intercepted where Python opens them (``builtins.open`` and ``io.open``); a wrapped file has no ``fileno``,
so that writers that would write to the descriptor (Pillow) go through ``write``.
"""

import argparse
import builtins
import errno
import io
import os
import signal
import sys

_real_open = builtins.open


class _Full:
    """A file whose first write fails half-way with ENOSPC."""

    def __init__(self, f, name):
        self._f = f
        self._name = name
        self._failed = False

    def write(self, data):
        if not self._failed:
            self._failed = True
            self._f.write(data[: len(data) // 2])
            self._f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)

    def fileno(self):
        raise io.UnsupportedOperation("fileno")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--enospc-on")
    parser.add_argument("--signal-on")
    parser.add_argument("--signal", default="INT", choices=["INT", "TERM"])
    args, rest = parser.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    sent = []

    def opened(file, mode="r", *a, **kw):
        writing = isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+")
        name = os.fspath(file) if writing else ""
        name = name.decode() if isinstance(name, bytes) else name
        if writing and args.signal_on and args.signal_on in name and not sent:
            sent.append(name)
            if args.signal == "INT":
                os.killpg(os.getpgid(0), signal.SIGINT)
            else:
                os.kill(os.getpid(), signal.SIGTERM)
        f = _real_open(file, mode, *a, **kw)
        if writing and args.enospc_on and args.enospc_on in os.path.basename(name):
            return _Full(f, name)
        return f

    builtins.open = opened
    io.open = opened
    from warp_meshad.__main__ import main as cli

    sys.exit(cli(rest))


if __name__ == "__main__":
    main()
