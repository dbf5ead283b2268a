"""One writer per output folder: :class:`FolderLock`, held by a run or a batch on its output folder, and
:class:`FolderBusy`, the refusal of a second one.

The lock is an advisory ``flock`` on ``.warp-meshad.lock`` in the folder, which holds the holder's PID, host,
command line and start time. A second process asking for the folder refuses at once with a message naming the holder
(or, with ``wait=True``, says so and waits until it is free). The kernel drops the lock of a process that dies, so a
lock file left by a killed process is taken over by the next one, which says whose it was. The holder removes the
file when it is done. Where the file system has no ``flock`` (some network file systems), the PID in the file decides:
a live process on this host holds the folder; anything else is taken over.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import pathlib
import socket
import sys
import time

from warp_meshad._src.app.config import ConfigError
from warp_meshad._src.mesh.files import new_file_mode

try:
    import fcntl
except ImportError:  # not on POSIX: the PID file alone
    fcntl = None

__all__ = ["LOCK_NAME", "FolderBusy", "FolderLock"]

LOCK_NAME = ".warp-meshad.lock"
_POLL_S = 0.2  # how often a waiter without flock looks again


class FolderBusy(ConfigError):
    """Another process writes to the output folder (key ``output``).

    Attributes:
        holder: what the lock file says of the holder: ``{"pid", "host", "command", "since"}`` (may be partial).
    """

    def __init__(self, where: str, folder, holder: dict):
        self.folder = str(folder)
        self.holder = dict(holder)
        super().__init__(where, "output", f"folder {self.folder!r} is in use by {_describe(holder)}; one process "
                                          "writes to a folder at a time: wait for it to finish (--wait waits), or "
                                          "choose another folder (--output DIR)")

    def __reduce__(self):
        return type(self), (self.where, self.folder, self.holder)


def _describe(holder: dict) -> str:
    pid = holder.get("pid", "?")
    text = f"another warp-meshad process (PID {pid}"
    if holder.get("host") and holder.get("host") != socket.gethostname():
        text += f" on {holder['host']}"
    if holder.get("command"):
        text += f": {holder['command']}"
    if holder.get("since"):
        text += f"; since {holder['since']}"
    return text + ")"


def _alive(pid) -> bool:
    """Whether a process ``pid`` runs on this host (one we may not signal counts as running)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", "replace")
        data = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _command() -> str:
    text = " ".join(["warp-meshad" if i == 0 and a.endswith(("__main__.py", "warp-meshad")) else a
                     for i, a in enumerate(sys.argv)])
    return text if len(text) <= 200 else text[:197] + "..."


class FolderLock:
    """The lock of one output folder, held from :meth:`acquire` (or ``with``) to :meth:`release`.

    Args:
        folder: the output folder (it exists).
        where: what set the folder (a config file, ``"--output DIR"``), named in :class:`FolderBusy`.
        wait: wait for the holder instead of refusing.
        log: ``log(text)`` for the messages (waiting, a stale lock taken over); None: silent.

    Attributes:
        took_over: what the lock file said of a previous holder that no longer held it (a process killed while it
            ran), or None.
    """

    def __init__(self, folder, where: str = "output", wait: bool = False, log=None):
        self.folder = pathlib.Path(folder)
        self.path = self.folder / LOCK_NAME
        self.where = where
        self.wait = wait
        self.log = log or (lambda text: None)
        self.took_over = None
        self._fd = None

    def acquire(self) -> FolderLock:
        """Take the lock.

        Raises:
            FolderBusy: another process holds it (and not ``wait``).
            ConfigError: key ``output``: the lock file cannot be made.
        """
        self._announced = False
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, new_file_mode())
            except OSError as exc:
                raise ConfigError(self.where, "output", f"cannot make the lock file {str(self.path)!r}: "
                                                        f"{exc.strerror or exc}") from None
            try:
                if not self._lock(fd) and self._held_by_another(fd):
                    os.close(fd)
                    time.sleep(_POLL_S)
                    continue
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:  # the holder removed the file as we took the lock: start again on the new one
                    os.close(fd)
                    continue
                previous = _read(fd)
                if previous.get("pid") not in (None, os.getpid()):
                    self.took_over = previous
                    state = "no longer running" if not _alive(previous.get("pid")) else "not holding it"
                    self.log(f"took over the lock of {self.folder} left by PID {previous.get('pid')} ({state})")
                me = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command(),
                      "since": datetime.datetime.now().isoformat(timespec="seconds")}
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, (json.dumps(me) + "\n").encode())
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return self

    def _busy(self, holder: dict) -> None:
        """Refuse (FolderBusy), or say once that this process waits."""
        if not self.wait:
            raise FolderBusy(self.where, self.folder, holder)
        if not self._announced:
            self.log(f"waiting for {_describe(holder)} to finish with {self.folder}")
            self._announced = True

    def _lock(self, fd: int) -> bool:
        """Take the flock of ``fd`` (waiting for it with ``wait``): True; False where the file system has none."""
        if fcntl is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            self._busy(_read(fd))
            fcntl.flock(fd, fcntl.LOCK_EX)
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return False
            raise

    def _held_by_another(self, fd: int) -> bool:
        """Without flock: whether the file names a live process of this host other than this one (refused, or to
        wait for)."""
        holder = _read(fd)
        pid = holder.get("pid")
        if pid == os.getpid() or holder.get("host", socket.gethostname()) != socket.gethostname() or not _alive(pid):
            return False
        self._busy(holder)
        return True

    def release(self) -> None:
        """Remove the lock file (while holding the lock) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
