"""A run's outputs written as one unit: :class:`OutputSet`, the manifest (:data:`MANIFEST`) that marks them
complete, :func:`verify_outputs` that checks it, and :class:`OutputWriteError`.

Each output is first written under a temporary name in the output folder (``.final.<token>.part.obj``: hidden, the
extension kept for writers that choose the format by it). Only when every file of the run is written are they renamed
into place, the earlier run's files (those its manifest listed) removed, and ``manifest.json`` written last: file
names, sizes and SHA-256 hashes. A folder counts as complete exactly when its manifest matches its files. Any
failure or interrupt before that removes the temporary files and leaves the folder as it was; one while renaming
removes the files renamed so far, so that no file of a half-written run is left looking complete. A full disk or any
other ``OSError`` while writing becomes :class:`OutputWriteError`, naming the file and the cause.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import secrets

from warp_meshad._src.app.interrupts import Interrupted, interrupted, signals_deferred
from warp_meshad._src.mesh.files import atomic_write, new_file_mode

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "OutputSet", "OutputWriteError", "file_digest", "read_manifest",
           "verify_outputs"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


class OutputWriteError(OSError):
    """Writing an output failed (a full disk, a lost permission, ...): the message names the file and the cause, and
    says that the run's other outputs were not written.

    Attributes:
        path: the output that could not be written (its final name).
        cause: the ``OSError`` raised.
        folder: the output folder.
        left: what the failure left, ending the message (default: no output of the run is in the folder).
    """

    def __init__(self, path, cause: OSError, folder, left: str | None = None):
        self.path = pathlib.Path(path)
        self.cause = cause
        self.folder = pathlib.Path(folder)
        self.left = left or f"no outputs of this run were written to {self.folder} (its temporary files are removed)"
        super().__init__(cause.errno, cause.strerror or str(cause))

    def __str__(self) -> str:
        reason = self.cause.strerror or str(self.cause) or type(self.cause).__name__
        code = f" [Errno {self.cause.errno}]" if self.cause.errno is not None else ""
        return f"cannot write {self.path}: {reason}{code}; {self.left}"

    def __reduce__(self):
        return type(self), (self.path, self.cause, self.folder, self.left)


def file_digest(path) -> dict:
    """``{"bytes": size, "sha256": hex digest}`` of a file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return {"bytes": size, "sha256": h.hexdigest()}


def read_manifest(folder) -> dict | None:
    """The folder's manifest (a dict with ``files``), or None when it is missing or unreadable."""
    try:
        data = json.loads((pathlib.Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return None
    return data


def verify_outputs(folder, required=()) -> tuple[dict | None, str]:
    """Whether a folder holds a complete run: its manifest lists ``required`` and every listed file exists with the
    listed size and hash.

    Args:
        folder: an output folder.
        required: names the manifest must list (``("final.obj", "metrics.json")``).

    Returns:
        ``(manifest, "")`` when complete, else ``(None, why)`` (``"no manifest.json"``, ``"final.obj has 0 bytes,
        its manifest 5157"``, ...).
    """
    folder = pathlib.Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        why = "no manifest.json" if not (folder / MANIFEST).exists() else "manifest.json is unreadable"
        return None, why
    files = manifest["files"]
    for name in required:
        if name not in files:
            return None, f"manifest.json does not list {name}"
    for name, want in files.items():
        path = folder / name
        if pathlib.Path(name).name != name:
            return None, f"manifest.json lists {name!r}, not a file of the folder"
        try:
            have = file_digest(path)
        except FileNotFoundError:
            return None, f"{name} is missing"
        except OSError as exc:
            return None, f"{name} is unreadable ({exc.strerror or exc})"
        if have["bytes"] != want.get("bytes"):
            return None, f"{name} has {have['bytes']} bytes, its manifest {want.get('bytes')}"
        if have["sha256"] != want.get("sha256"):
            return None, f"{name} differs from its manifest's hash"
    return manifest, ""


class OutputSet:
    """The outputs of one run into one folder, written under temporary names and put in place together by
    :meth:`commit` (see the module docstring). As a context manager it removes its temporary files when the block
    ends without a commit (an error or an interrupt).

    Args:
        folder: the output folder (it exists).
    """

    def __init__(self, folder):
        self.folder = pathlib.Path(folder)
        self.token = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.files: dict[str, dict] = {}
        self.committed = False

    def temp_path(self, name: str) -> pathlib.Path:
        """Where output ``name`` is written before :meth:`commit`."""
        p = pathlib.Path(name)
        return self.folder / f".{p.stem}.{self.token}.part{p.suffix}"

    def write(self, name: str, write) -> bool:
        """Write output ``name``: ``write(tmp_path)`` writes the file at a temporary path (it may write nothing: a
        skipped output). Returns whether the file was written.

        Raises:
            OutputWriteError: ``write`` raised an ``OSError``.
            Interrupted: a signal came before (nothing more is written after it).
        """
        self._check_signal()
        try:
            write(self.temp_path(name))
        except OutputWriteError:
            raise
        except OSError as exc:
            raise OutputWriteError(self.folder / name, exc, self.folder) from None
        return self.add(name)

    def add(self, name: str) -> bool:
        """Take output ``name`` written at :meth:`temp_path` by other means (a child process); False if it is not
        there. It gets an ordinary new file's permissions."""
        tmp = self.temp_path(name)
        if not tmp.is_file():
            return False
        try:
            os.chmod(tmp, new_file_mode())
            self.files[name] = file_digest(tmp)
        except OSError as exc:
            raise OutputWriteError(self.folder / name, exc, self.folder) from None
        return True

    def commit(self, info: dict | None = None) -> dict[str, pathlib.Path]:
        """Put the outputs in place: remove the earlier run's manifest and the files it listed that this run does not
        write, rename every output to its name, write ``manifest.json`` (``info`` merged in: app, scene, ...) last.
        A signal that arrives meanwhile takes effect after it.

        Returns:
            ``{name: path}`` of the outputs, ``manifest.json`` last.

        Raises:
            OutputWriteError: a rename or the manifest failed; the files renamed so far are removed again.
            Interrupted: a signal came before the commit started (nothing renamed).
        """
        with signals_deferred():
            self._check_signal()
            old = read_manifest(self.folder)
            manifest_path = self.folder / MANIFEST
            done: list[pathlib.Path] = []
            current = self.folder
            try:
                current = manifest_path
                manifest_path.unlink(missing_ok=True)
                for name in (old or {}).get("files", {}):
                    if name not in self.files and pathlib.Path(name).name == name:
                        current = self.folder / name
                        current.unlink(missing_ok=True)
                for name in self.files:
                    current = self.folder / name
                    os.replace(self.temp_path(name), current)
                    done.append(current)
                current = manifest_path
                body = {"format": MANIFEST_FORMAT, **(info or {}), "files": self.files}
                atomic_write(manifest_path, lambda tmp: pathlib.Path(tmp).write_text(json.dumps(body, indent=1) + "\n"))
            except BaseException as exc:
                for p in done:
                    try:
                        p.unlink()
                    except OSError:
                        pass
                self.discard()
                if isinstance(exc, OSError):
                    raise OutputWriteError(current, exc, self.folder) from None
                raise
            self.committed = True
        return {**{name: self.folder / name for name in self.files}, MANIFEST: manifest_path}

    def discard(self) -> None:
        """Remove every temporary file of this set (and those its writers made beside them)."""
        mark = f".{self.token}."
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return
        for entry in entries:
            if mark in entry.name:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    def _check_signal(self) -> None:
        signum = interrupted()
        if signum is not None:
            raise Interrupted(signum)

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, *exc) -> None:
        if not self.committed:
            self.discard()
