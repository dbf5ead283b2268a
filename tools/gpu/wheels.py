"""Wheels carried to an offline GPU host in parts, their manifest, and their install there.

A bundle is a folder holding ``manifest.json`` and parts named ``wheels.partNN``. The wheels are concatenated in
manifest order and that byte stream is cut into parts of at most ``part_bytes`` bytes, so a wheel may span two
parts. The manifest lists

- ``parts``: each part's size, sha256, and ``required``: whether a wheel of group ``wheels`` lies in it (a part
  holding fallbacks only is carried only to a host that needs one of them);
- ``wheels``: each wheel's file, name, version, size, sha256, group, the ``[part, offset, length]`` ranges that hold
  it, and ``required_by``: the ``[requirer, requirement]`` pairs that brought it in (``"<project>"`` for the
  project's own requirements). Group ``wheels`` is always installed; group ``fallback`` holds distributions the host
  has at a version not known when the bundle was built, installed only where the host's own version does not meet a
  requirement of an installed requirer;
- ``host``: the distributions left to the host, each with its ``required_by`` pairs, checked there before anything
  runs.

On the host (``tools/gpu/remote.sh`` does this), once per transfer call and then once before a stage::

    python3 -m tools.gpu.wheels receive .gpu /tmp/gpu    # the carried manifest and parts; prints what is missing
    python3 -m tools.gpu.wheels install /tmp/gpu /tmp/site

Standard library only, plus ``packaging`` (on the host's image) for the version checks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable

MANIFEST = "manifest.json"
PROJECT = "<project>"
GROUPS = ("wheels", "fallback")
FORMAT = 1
_CHUNK = 1 << 20


def sha256_file(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def part_name(index: int) -> str:
    """``wheels.part00``, ``wheels.part01``, ..."""
    return f"wheels.part{index:02d}"


class _PartWriter:
    """Writes a byte stream into consecutive parts of at most ``part_bytes`` bytes."""

    def __init__(self, out: pathlib.Path, part_bytes: int):
        self.out, self.part_bytes = out, part_bytes
        self.index, self.file, self.used, self.digest = -1, None, 0, None
        self.parts: dict[str, dict] = {}

    def _next(self):
        self._close_current()
        self.index += 1
        self.file = open(self.out / part_name(self.index), "wb")
        self.used, self.digest = 0, hashlib.sha256()

    def _close_current(self):
        if self.file is not None:
            self.file.close()
            self.parts[part_name(self.index)] = {"bytes": self.used, "sha256": self.digest.hexdigest()}
            self.file = None

    def write(self, data: bytes) -> list[list]:
        """Append ``data``; returns the ``[part, offset, length]`` ranges it went to."""
        ranges = []
        while data:
            if self.file is None or self.used == self.part_bytes:
                self._next()
            n = min(len(data), self.part_bytes - self.used)
            self.file.write(data[:n])
            self.digest.update(data[:n])
            ranges.append([part_name(self.index), self.used, n])
            self.used += n
            data = data[n:]
        return ranges

    def close(self) -> dict[str, dict]:
        self._close_current()
        return self.parts


def _merge(ranges: list[list]) -> list[list]:
    """Join adjacent ranges of the same part."""
    out: list[list] = []
    for part, offset, length in ranges:
        if out and out[-1][0] == part and out[-1][1] + out[-1][2] == offset:
            out[-1][2] += length
        else:
            out.append([part, offset, length])
    return out


def pack(wheels: list[dict], out: pathlib.Path, part_bytes: int, **fields) -> dict:
    """Write the parts of a bundle and its manifest into ``out``.

    Args:
        wheels: one dict per wheel: ``path`` (the wheel file), ``group`` (one of :data:`GROUPS`), and the fields the
            manifest keeps for it (``name``, ``version``, ``required_by``, ...). Written in the given order, so the
            ``fallback`` wheels best come last, smallest first: they then fill the last required part.
        out: the bundle folder (created); parts of an earlier bundle there are not removed.
        part_bytes: the largest part, in bytes (> 0).
        **fields: more top-level manifest fields (``host``, ``python``, ...).

    Returns:
        The manifest, as written to ``out / "manifest.json"``.
    """
    if part_bytes <= 0:
        raise ValueError(f"part_bytes must be > 0, got {part_bytes}")
    bad = sorted({str(w.get("group")) for w in wheels} - set(GROUPS))
    if bad:
        raise ValueError(f"wheel groups must be one of {GROUPS}, got {bad}")
    out.mkdir(parents=True, exist_ok=True)
    writer, entries = _PartWriter(out, part_bytes), []
    for wheel in wheels:
        path = pathlib.Path(wheel["path"])
        digest, ranges = hashlib.sha256(), []
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                ranges += writer.write(chunk)
        entry = {k: v for k, v in wheel.items() if k != "path"}
        entry.update(file=path.name, bytes=path.stat().st_size, sha256=digest.hexdigest(), parts=_merge(ranges))
        entries.append(entry)
    parts = writer.close()
    for name, info in parts.items():
        info["required"] = any(w["group"] == "wheels" and any(r[0] == name for r in w["parts"]) for w in entries)
    manifest = {"format": FORMAT, "part_bytes": part_bytes, **fields, "parts": parts, "wheels": entries}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load(folder: pathlib.Path) -> dict:
    """The manifest in ``folder``, checked for its format."""
    path = folder / MANIFEST
    if not path.is_file():
        old = sorted(p.name for p in folder.glob("*.part00")) if folder.is_dir() else []
        hint = f" (found {', '.join(old)}: parts of another layout)" if old else ""
        raise FileNotFoundError(f"{path}: no bundle manifest{hint}; build one with `bash tools/gpu/bundle.sh` and "
                                f"carry .gpu/{MANIFEST} in every transfer call")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: manifest format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def receive(src: pathlib.Path, dest: pathlib.Path) -> tuple[list[str], list[str]]:
    """Copy the manifest and the parts carried in ``src`` into ``dest``, each part checked against its sha256.

    A manifest in ``src`` unlike the one in ``dest`` (another bundle) replaces it, and the parts ``dest`` held are
    dropped. Without a manifest in ``src``, ``dest``'s is used.

    Returns:
        ``(received, missing)``: the part names copied in this call, and those ``dest`` still lacks.

    Raises:
        ValueError: a carried part whose size or sha256 is not the manifest's (named in the message).
    """
    carried = src / MANIFEST
    if not carried.is_file() and not (dest / MANIFEST).is_file():
        load(src)  # raises, naming what src holds instead
    dest.mkdir(parents=True, exist_ok=True)
    if carried.is_file():
        current = dest / MANIFEST
        if not current.is_file() or current.read_bytes() != carried.read_bytes():
            for old in dest.glob("*.part[0-9][0-9]"):
                old.unlink()
            shutil.copyfile(carried, current)
    manifest = load(dest)
    received = []
    for name, info in manifest["parts"].items():
        part = src / name
        if not part.is_file():
            continue
        size, digest = part.stat().st_size, sha256_file(part)
        if size != info["bytes"] or digest != info["sha256"]:
            raise ValueError(f"{part}: {size} bytes with sha256 {digest}; the manifest says {info['bytes']} bytes "
                             f"with sha256 {info['sha256']}")
        if (dest / name).resolve() != part.resolve():
            shutil.copyfile(part, dest / name)
        received.append(name)
    missing = [name for name in manifest["parts"] if not (dest / name).is_file()]
    return received, missing


def extract(entry: dict, parts_dir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """Reassemble one wheel of the manifest from its parts into ``dest`` and check its sha256.

    Raises:
        FileNotFoundError: a part that holds it is not in ``parts_dir``.
        ValueError: a part cut short, or a wheel whose sha256 is not the manifest's (the wheel file is named; the
            wrong file is removed).
    """
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / entry["file"]
    digest = hashlib.sha256()
    with open(target, "wb") as f:
        for name, offset, length in entry["parts"]:
            with open(parts_dir / name, "rb") as p:
                p.seek(offset)
                data = p.read(length)
            if len(data) != length:
                target.unlink()
                raise ValueError(f"{parts_dir / name}: {len(data)} bytes at offset {offset}, expected {length} "
                                 f"for {entry['file']} (part cut short)")
            digest.update(data)
            f.write(data)
    got = digest.hexdigest()
    if got != entry["sha256"]:
        target.unlink()
        raise ValueError(f"{entry['file']}: sha256 {got}, the manifest says {entry['sha256']}")
    return target


def installed_version(name: str, path: list[str] | None = None) -> str | None:
    """The version of the distribution ``name`` found on ``path`` (default ``sys.path``), or None."""
    for dist in importlib.metadata.distributions(name=name, path=path if path is not None else sys.path):
        return dist.version
    return None


def unmet(requirement: str, path: list[str] | None = None) -> str | None:
    """Why the distributions on ``path`` do not meet ``requirement``, or None when they do.

    The installed version must match the specifier; for ``name[extra]`` each requirement the installed distribution
    declares for that extra must be met too (one level down).
    """
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    version = installed_version(req.name, path)
    if version is None:
        return f"{req.name} is not installed"
    if not req.specifier.contains(version, prereleases=True):
        return f"{req.name} {version} does not meet {req.specifier}"
    if req.extras:
        dist = next(iter(importlib.metadata.distributions(name=req.name, path=path if path is not None else sys.path)))
        for line in dist.requires or []:
            sub = Requirement(line)
            for extra in sorted(req.extras):
                # the extra's own requirements: true with the extra, false without it
                if sub.marker is None or not sub.marker.evaluate({"extra": extra}):
                    continue
                if sub.marker.evaluate({"extra": ""}):
                    continue
                why = unmet(str(Requirement(f"{sub.name}{sub.specifier}")), path)
                if why:
                    return f"{req.name}[{extra}] needs {sub.name}{sub.specifier}: {why}"
    return None


def choose(manifest: dict, path: list[str] | None = None) -> tuple[list[dict], list[str], list[str]]:
    """Decide what to install on this host and check what is left to it.

    Every ``wheels`` wheel is installed. A ``fallback`` wheel is installed where a requirement on it from the project
    or from an installed wheel is not met by the host's own distributions; this repeats until no more are added. The
    ``host`` distributions are checked against the requirements of installed requirers.

    Returns:
        ``(install, notes, problems)``: the wheel entries to install, one line per fallback taken (with the reason),
        and one line per requirement the host does not meet (nothing should run then).
    """
    install = [w for w in manifest["wheels"] if w["group"] == "wheels"]
    names = {PROJECT} | {w["name"] for w in install}
    pending = [w for w in manifest["wheels"] if w["group"] == "fallback"]
    notes = []
    added = True
    while added:
        added = False
        for wheel in list(pending):
            for requirer, requirement in wheel["required_by"]:
                why = unmet(requirement, path) if requirer in names else None
                if why:
                    install.append(wheel)
                    names.add(wheel["name"])
                    pending.remove(wheel)
                    notes.append(f"fallback {wheel['file']}: {why} (required by {requirer})")
                    added = True
                    break
    problems = []
    for entry in manifest.get("host", []):
        for requirer, requirement in entry["required_by"]:
            why = unmet(requirement, path) if requirer in names else None
            if why:
                problems.append(f"the host's {entry['name']}: {why} (required by {requirer}); pack it (bundle --pack "
                                f"{entry['name']}) or record the host's version in tools/gpu/bundle.py")
    return install, notes, problems


def _pip_install(wheels: list[pathlib.Path], site: pathlib.Path) -> None:
    # bytecode compiled as a user's pip install does: a run imports .pyc files, not sources (where the environment
    # sets PYTHONDONTWRITEBYTECODE, sources left uncompiled are compiled again by every process)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir",
                    "--disable-pip-version-check", "--target", str(site), *map(str, wheels)], check=True)


def install(parts_dir: pathlib.Path, site: pathlib.Path, path: list[str] | None = None,
            installer: Callable[[list[pathlib.Path], pathlib.Path], None] = _pip_install) -> int:
    """Install the bundle in ``parts_dir`` into ``site`` (emptied first) unless that bundle is there already.

    Returns:
        0 when installed (or already there), 3 when a part it needs has not been received, 4 when the host does not
        meet a requirement left to it. What is wrong is printed.
    """
    manifest = load(parts_dir)
    ident = hashlib.sha256((parts_dir / MANIFEST).read_bytes()).hexdigest()
    stamp = site / ".bundle-manifest-sha256"
    if stamp.is_file() and stamp.read_text().strip() == ident:
        print(f"[wheels] {site}: this bundle is installed")
        return 0
    chosen, notes, problems = choose(manifest, path)
    for line in notes:
        print(f"[wheels] {line}")
    if problems:
        print("\n".join(f"[wheels] {line}" for line in problems))
        return 4
    missing = [name for name in needed_parts(manifest, chosen) if not (parts_dir / name).is_file()]
    if missing:
        print(f"[wheels] parts not received yet: {' '.join(missing)} (carry each in a call before this one)")
        return 3
    if site.exists():
        shutil.rmtree(site)
    staging = parts_dir / "wheels"
    shutil.rmtree(staging, ignore_errors=True)
    files = [extract(w, parts_dir, staging) for w in chosen]
    installer(files, site)
    shutil.rmtree(staging)
    stamp.write_text(ident + "\n")
    print(f"[wheels] installed {len(files)} wheels into {site}: "
          + ", ".join(f"{w['name']} {w['version']}" for w in chosen))
    return 0


def host_report(manifest: dict, path: list[str] | None = None) -> list[str]:
    """One line per distribution the bundle leaves or may leave to the host: its version here and the requirements."""
    lines = []
    entries = [*manifest.get("host", []), *(w for w in manifest["wheels"] if w["group"] == "fallback")]
    for entry in sorted(entries, key=lambda e: e["name"]):
        have = installed_version(entry["name"], path)
        wants = "; ".join(sorted({req for _, req in entry["required_by"]}))
        kind = "fallback" if "group" in entry else "host"
        lines.append(f"{kind:8s} {entry['name']}: here {have or 'none'}; wanted {wants}")
    return lines


def needed_parts(manifest: dict, chosen: list[dict]) -> list[str]:
    """The parts that hold the chosen wheels, in order."""
    held = {r[0] for w in chosen for r in w["parts"]}
    return [name for name in manifest["parts"] if name in held]


def _summary(received: Iterable[str], missing: list[str], manifest: dict, needed: list[str]) -> str:
    mb = sum(manifest["parts"][p]["bytes"] for p in received) / 1e6
    still = [m for m in missing if m in needed]
    spare = [m for m in missing if m not in needed]
    return (f"[wheels] received {' '.join(received) or 'no part'} ({mb:.1f} MB); parts this host still needs: "
            f"{' '.join(still) or 'none'}" + (f"; not needed here: {' '.join(spare)}" if spare else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.gpu.wheels", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("receive", help="copy the carried manifest and parts into a folder that gathers them")
    p.add_argument("src", type=pathlib.Path)
    p.add_argument("dest", type=pathlib.Path)
    p = sub.add_parser("install", help="install the gathered bundle into a site folder")
    p.add_argument("parts", type=pathlib.Path)
    p.add_argument("site", type=pathlib.Path)
    p = sub.add_parser("check", help="the host's versions of what the bundle leaves to it, and what would be installed")
    p.add_argument("parts", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.command == "receive":
        received, missing = receive(args.src, args.dest)
        manifest = load(args.dest)
        chosen, notes, problems = choose(manifest)
        for line in notes + problems:
            print(f"[wheels] {line}")
        print(_summary(received, missing, manifest, needed_parts(manifest, chosen)))
        return 0
    if args.command == "install":
        return install(args.parts, args.site)
    manifest = load(args.parts)
    print("\n".join(host_report(manifest)))
    _, notes, problems = choose(manifest)
    print("\n".join(notes + problems) or "the host meets every requirement left to it; no fallback needed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
