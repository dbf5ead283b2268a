"""Build the wheel bundle for the offline GPU host from what pip resolves for the project's extras.

    python -m tools.gpu.bundle                          # extras cudss,apps -> .gpu/manifest.json, .gpu/*.partNN
    python -m tools.gpu.bundle --extras cudss,apps,batch   # with Ray (the batch runner's workers)
    python -m tools.gpu.bundle --dry-run                # resolve and print the plan; download and write nothing

1. pip resolves the project with its extras for the host's interpreter and platform (``pip install --dry-run
   --report``, wheels only, ``--python-version 3.12`` and the manylinux tags of :data:`PLATFORMS`): the set a user
   gets from ``pip install ".[cudss,apps]"`` there.
2. Each distribution of that set is followed from the project's requirements and taken as one of:

   - ``host``: the host has it at a version (:data:`HOST_VERSIONS`) that meets every requirement on it, or has it at
     an unrecorded version (:data:`HOST_UNRECORDED`) where any version will do or where its wheel is larger than
     ``--fallback-max-mb``. Not packed; what it requires is not followed (the host's install holds its needs); its
     requirements are checked on the host before anything runs (:func:`tools.gpu.wheels.choose`).
   - ``fallback``: the host has it at an unrecorded version and a requirement names versions. Packed in the
     ``fallback`` parts; the host installs it only where its own version falls short.
   - ``wheels``: not on the host, or on it at a version that misses a requirement (then it shadows the host's).

   A requirement counts only when its requirer is the project or a packed distribution, so the choice is repeated
   until it no longer changes.
3. The packed wheels are downloaded unmodified (``pip download --no-deps``; sha256 checked against the resolution)
   and written by :func:`tools.gpu.wheels.pack` into parts that fit one transfer call beside the working tree. The
   carry plan (which call carries which part) is printed and written to ``.gpu/plan.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools.gpu import wheels as bundle_wheels

ROOT = pathlib.Path(__file__).resolve().parents[2]
CALL_LIMIT = 64 * 2**20  # what one transfer call may carry, working tree included
MARGIN = 2 * 2**20  # kept free under CALL_LIMIT for files added to the tree before the calls
PYTHON = "3.12"
# the host's glibc is 2.39; these tags are the ones the device notes name (pip matches each tag exactly)
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
# the environment markers are evaluated in: the host's interpreter (Python 3.12.3 on x86-64 Linux)
TARGET_ENV = {"python_version": PYTHON, "python_full_version": "3.12.3", "implementation_name": "cpython",
              "implementation_version": "3.12.3", "platform_python_implementation": "CPython",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}

# Versions read on the host: the pip list of its image (numpy, cupy, torch, jax, ...) and an app run's recorded
# versions there (scipy). A requirement these versions meet leaves the distribution to the host.
HOST_VERSIONS = {
    "accelerate": "1.15.0", "botorch": "0.18.1", "cupy-cuda13x": "14.2.0", "gpytorch": "1.15.2",
    "huggingface-hub": "1.33.0", "jax": "0.11.2", "jax-cuda13-pjrt": "0.11.2", "jax-cuda13-plugin": "0.11.2",
    "jaxlib": "0.11.2", "jaxtyping": "0.3.11", "numpy": "2.5.2", "numpyro": "0.21.0", "onnx": "1.23.1",
    "onnx-ir": "1.0.0", "onnxruntime": "1.30.0", "onnxscript": "0.7.2", "pytorch-lightning": "2.6.6",
    "safetensors": "0.8.0", "scipy": "1.18.1", "sentence-transformers": "6.0.1", "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0", "torch-geometric": "2.8.0.post1",
    "torchaudio": "2.11.0", "torchdiffeq": "0.2.5", "torchmetrics": "1.9.0", "torchvision": "0.26.0",
    "transformers": "5.17.0", "triton": "3.6.0",
}
# On the host's image too, at versions not recorded here (its package list). `python3 -m tools.gpu.wheels check`
# there prints their versions: record them above and they are decided here instead of on the host.
HOST_UNRECORDED = set("""
absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi charset-normalizer chex
click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cycler
cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna imageio iniconfig interface-meta jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pyyaml regex requests rich sacrebleu scikit-build-core scikit-image scikit-learn seaborn setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
tensorstore threadpoolctl tifffile timm toolz tqdm treescope typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()) - set(HOST_VERSIONS)


@dataclasses.dataclass
class Dist:
    """One distribution of pip's resolution."""

    name: str  # canonical
    version: str
    requires: list[str]  # Requires-Dist lines
    url: str = ""
    sha256: str = ""
    direct: bool = False  # the project itself

    @property
    def file(self) -> str:
        return urllib.parse.unquote(self.url.rsplit("/", 1)[-1])


@dataclasses.dataclass
class Choice:
    """What the bundle does with one distribution, and why."""

    role: str  # "host", "fallback" or "wheels"
    why: str
    required_by: list[tuple[str, str]]  # (requirer, requirement)


def platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for tag in PLATFORMS:
        args += ["--platform", tag]
    return args


def resolve(extras: list[str], extra_specs: list[str]) -> dict[str, Dist]:
    """pip's resolution of the project with ``extras`` (and ``extra_specs``) for the host; canonical name -> Dist."""
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--target",
               str(pathlib.Path(tmp) / "site"), *platform_args(), "--report", str(report), target, *extra_specs]
        subprocess.run(cmd, check=True)
        items = json.loads(report.read_text())["install"]
    out = {}
    for item in items:
        meta, info = item["metadata"], item["download_info"]
        dist = Dist(name=canonicalize_name(meta["name"]), version=meta["version"],
                    requires=meta.get("requires_dist") or [], url=info["url"],
                    sha256=info.get("archive_info", {}).get("hashes", {}).get("sha256", ""),
                    direct="dir_info" in info)
        out[dist.name] = dist
    return out


def edges(requires: list[str], extras: set[str]) -> list[Requirement]:
    """The requirements among ``requires`` that apply on the host with ``extras`` requested."""
    out = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in ["", *sorted(extras)]):
            out.append(req)
    return out


def decide(dists: dict[str, Dist], root: list[Requirement], size_of, fallback_max: int,
           host_versions: dict[str, str] | None = None, host_unrecorded: set[str] | None = None,
           force: set[str] = frozenset()) -> dict[str, Choice]:
    """The role of every distribution reached from the project's requirements ``root`` (see the module docstring).

    Args:
        dists: pip's resolution, canonical name -> Dist.
        root: the project's requirements that apply (with its extras).
        size_of: ``Dist -> bytes`` of its wheel (asked only for fallback candidates).
        fallback_max: the largest wheel, in bytes, carried as a fallback.
        host_versions, host_unrecorded: the host's distributions (default :data:`HOST_VERSIONS`,
            :data:`HOST_UNRECORDED`).
        force: canonical names packed whatever the host has.
    """
    host_versions = {canonicalize_name(k): v for k, v in (HOST_VERSIONS if host_versions is None
                                                          else host_versions).items()}
    host_unrecorded = {canonicalize_name(n) for n in (HOST_UNRECORDED if host_unrecorded is None
                                                      else host_unrecorded)}
    force = {canonicalize_name(n) for n in force}
    choices: dict[str, Choice] = {}
    for _ in range(len(dists) + 2):
        reqs: dict[str, list[tuple[str, Requirement]]] = {}
        frontier = [(bundle_wheels.PROJECT, root)]
        seen: set[tuple[str, frozenset]] = set()
        while frontier:
            requirer, requirements = frontier.pop()
            for req in requirements:
                name = canonicalize_name(req.name)
                if name not in dists:
                    raise ValueError(f"{requirer} requires {req}, which pip's resolution does not hold")
                pairs = reqs.setdefault(name, [])
                if (requirer, str(req)) not in {(r, str(q)) for r, q in pairs}:
                    pairs.append((requirer, req))
            for name in sorted({canonicalize_name(r.name) for r in requirements}):
                if choices.get(name, Choice("", "", [])).role not in ("wheels", "fallback"):
                    continue
                extras = frozenset(e for _, r in reqs[name] for e in r.extras)
                if (name, extras) not in seen:
                    seen.add((name, extras))
                    frontier.append((name, edges(dists[name].requires, set(extras))))
        new = {name: _choose(dists[name], pairs, choices, size_of, fallback_max, host_versions, host_unrecorded,
                             force) for name, pairs in reqs.items()}
        if new == choices:
            return choices
        choices = new
    raise RuntimeError("the choice of wheels did not settle")


def bare(req: Requirement) -> str:
    """``req`` without its marker (markers are evaluated before): ``name[extras]specifier``."""
    out = Requirement(str(req))
    out.marker = None
    return str(out)


def _choose(dist, pairs, choices, size_of, fallback_max, host_versions, host_unrecorded, force) -> Choice:
    required_by = sorted({(r, bare(q)) for r, q in pairs})
    wanted = ", ".join(f"{q} ({r})" for r, q in required_by)
    # packed, but installed only with a fallback that needs it: every requirer is a fallback
    role = "fallback" if all(choices.get(r, Choice("", "", [])).role == "fallback" for r, _ in pairs) else "wheels"
    only = f"; needed only by the fallbacks {', '.join(sorted({r for r, _ in pairs}))}" if role == "fallback" else ""
    if dist.name in force:
        return Choice(role, "packed on request (--pack)" + only, required_by)
    if dist.name in host_versions:
        have = host_versions[dist.name]
        misses = [f"{q} ({r})" for r, q in pairs if not q.specifier.contains(Version(have), prereleases=True)]
        if misses:
            return Choice(role, f"the host's {have} misses {', '.join(misses)}: shadows it" + only, required_by)
        return Choice("host", f"the host's {have} meets {wanted}", required_by)
    if dist.name in host_unrecorded:
        if all(not q.specifier and not q.extras for _, q in pairs):
            return Choice("host", f"on the host (version not recorded); any version will do for {wanted}",
                          required_by)
        size = size_of(dist)
        if size > fallback_max:
            return Choice("host", f"on the host (version not recorded); its {size / 1e6:.0f} MB wheel is over "
                          f"--fallback-max-mb: {wanted} is checked there", required_by)
        return Choice("fallback", f"on the host (version not recorded): installed there only if it misses {wanted}",
                      required_by)
    return Choice(role, "not on the host" + only, required_by)


def wheel_size(dist: Dist, cache: pathlib.Path) -> int:
    """Bytes of the wheel: from the download cache, a local index, or the index's answer to a HEAD request."""
    cached = cache / dist.file
    if cached.is_file():
        return cached.stat().st_size
    url = urllib.parse.urlparse(dist.url)
    if url.scheme == "file":
        return os.path.getsize(urllib.parse.unquote(url.path))
    with urllib.request.urlopen(urllib.request.Request(dist.url, method="HEAD"), timeout=60) as answer:
        return int(answer.headers["Content-Length"])


def download(dists: list[Dist], cache: pathlib.Path) -> list[pathlib.Path]:
    """The wheels of ``dists`` in ``cache`` (pip downloads the missing ones), each checked against its sha256."""
    cache.mkdir(parents=True, exist_ok=True)
    want = [d for d in dists if not (cache / d.file).is_file() or bundle_wheels.sha256_file(cache / d.file) != d.sha256]
    if want:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *platform_args(), "-d", str(cache),
                        *(f"{d.name}=={d.version}" for d in want)], check=True)
    paths = []
    for d in dists:
        path = cache / d.file
        if not path.is_file():
            raise FileNotFoundError(f"pip download did not write {path} ({d.name} {d.version})")
        got = bundle_wheels.sha256_file(path)
        if d.sha256 and got != d.sha256:
            raise ValueError(f"{path}: sha256 {got}, pip's resolution says {d.sha256}")
        paths.append(path)
    return paths


def tree_bytes() -> int:
    """Bytes of the working tree a transfer call sends: tracked and untracked files git does not ignore."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    return sum((ROOT / os.fsdecode(f)).stat().st_size for f in files if f and (ROOT / os.fsdecode(f)).is_file())


def carry_plan(manifest: dict, tree: int, out_rel: str, cache_file: pathlib.Path | None) -> list[str]:
    """The transfer calls, one line each: what a call carries, its bytes with the tree, and its command."""
    manifest_path = f"{out_rel}/{bundle_wheels.MANIFEST}"
    manifest_bytes = len(json.dumps(manifest, indent=1)) + 1
    required = [p for p, info in manifest["parts"].items() if info["required"]]
    fallback = [p for p, info in manifest["parts"].items() if not info["required"]]
    lines = []

    def call(number, parts, extra, command):
        carry = [manifest_path, *(f"{out_rel}/{p}" for p in parts), *extra]
        size = tree + manifest_bytes + sum(manifest["parts"][p]["bytes"] for p in parts)
        size += sum(pathlib.Path(ROOT / e).stat().st_size for e in extra)
        flag = "" if size <= CALL_LIMIT - MARGIN else "  OVER THE LIMIT: use a smaller --part-mb"
        lines.append(f"{number:>3}. carry {json.dumps(carry)}  ({size / 2**20:.1f} MiB with the tree){flag}\n"
                     f"     command: {command}")

    cache = [str(cache_file.relative_to(ROOT))] if cache_file is not None and cache_file.is_file() else []
    for i, part in enumerate(required[:-1], 1):
        call(i, [part], [], "bash tools/gpu/remote.sh receive")
    call(len(required), required[-1:], cache, "bash tools/gpu/remote.sh tests   (or any stage: bench19, -- CMD, ...)")
    if fallback:
        lines.append("   Parts of fallbacks only: carry one in a `receive` call before the last only where the first "
                     "call's last line names it among the parts this host still needs:")
        for part in fallback:
            held = [w["name"] for w in manifest["wheels"] if any(r[0] == part for r in w["parts"])]
            lines.append(f"     {part} ({manifest['parts'][part]['bytes'] / 1e6:.1f} MB): {', '.join(held)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu.bundle", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extras", default="cudss,apps", help="the project's extras to resolve (default cudss,apps)")
    parser.add_argument("--extra", action="append", default=[], metavar="SPEC",
                        help="another requirement resolved with the project (repeatable)")
    parser.add_argument("--pack", action="append", default=[], metavar="NAME",
                        help="pack this distribution whatever the host has (repeatable)")
    parser.add_argument("--part-mb", type=float, default=40.0, help="the largest part, in MB (default 40)")
    parser.add_argument("--fallback-max-mb", type=float, default=20.0,
                        help="the largest wheel carried as a fallback, in MB (default 20)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / ".gpu", help="the bundle folder (default .gpu)")
    parser.add_argument("--dry-run", action="store_true", help="resolve and print the choices only")
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    out = args.out.resolve()
    cache = out / "cache"

    dists = resolve(extras, args.extra)
    project = next(d for d in dists.values() if d.direct)
    root = edges(project.requires, set(extras)) + [Requirement(s) for s in args.extra]
    choices = decide(dists, root, lambda d: wheel_size(d, cache), int(args.fallback_max_mb * 1e6),
                     force=set(args.pack))
    table = [f"pip resolved {len(dists) - 1} distributions for {project.name}[{','.join(extras)}] "
             f"(Python {PYTHON}, {', '.join(PLATFORMS)}); the role of each and why:"]
    for name in sorted(n for n in dists if n != project.name):
        d, c = dists[name], choices.get(name)
        role = c.role if c else "-"
        why = c.why if c else "not followed: required only by " + ", ".join(
            f"{r} ({choices[r].role if r in choices else 'not followed'})" for r, o in sorted(dists.items())
            if r != name and any(canonicalize_name(Requirement(line).name) == name for line in o.requires))
        table.append(f"  {role:8s} {d.name} {d.version}: {why}")
    print("\n".join(table))
    if args.dry_run:
        return 0

    # the always-installed wheels by name, then the fallbacks smallest first (they fill the last required part)
    packed = sorted((n for n, c in choices.items() if c.role == "wheels"))
    packed += sorted((n for n, c in choices.items() if c.role == "fallback"),
                     key=lambda n: (wheel_size(dists[n], cache), n))
    paths = download([dists[n] for n in packed], cache)
    wheels_in = [{"path": p, "group": choices[n].role, "name": n, "version": dists[n].version,
                  "required_by": choices[n].required_by} for n, p in zip(packed, paths)]
    host = [{"name": n, "version": HOST_VERSIONS.get(n), "resolved": dists[n].version, "why": c.why,
             "required_by": c.required_by} for n, c in sorted(choices.items()) if c.role == "host"]
    not_needed = sorted(n for n in dists if n not in choices and n != project.name)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # the old parts stay until the new ones are written
        staged = pathlib.Path(tmp)
        manifest = bundle_wheels.pack(wheels_in, staged, int(args.part_mb * 1e6), project=project.name,
                                      extras=extras, python=PYTHON, platforms=PLATFORMS, host=host,
                                      not_needed=not_needed)
        # the new bundle replaces the old one: parts of any layout, their .sha256 files, the old raydeps/ folder
        for old in [*out.glob("*.part[0-9][0-9]"), *out.glob("*.sha256"), out / bundle_wheels.MANIFEST]:
            if old.is_file():
                old.unlink()
        if (out / "raydeps").is_dir():
            shutil.rmtree(out / "raydeps")
        for f in staged.iterdir():
            os.replace(f, out / f.name)
    try:
        out_rel = str(out.relative_to(ROOT))
    except ValueError:
        out_rel = str(out)
    tree = tree_bytes()
    lines = [f"bundle: {len(manifest['wheels'])} wheels in {len(manifest['parts'])} parts under {out_rel}/ "
             f"(working tree {tree / 2**20:.1f} MiB; a call carries at most {CALL_LIMIT / 2**20:.0f} MiB)"]
    for part, info in manifest["parts"].items():
        held = [w["file"] for w in manifest["wheels"] if any(r[0] == part for r in w["parts"])]
        lines.append(f"  {part}  {info['bytes'] / 1e6:5.1f} MB  {', '.join(held)}")
    lines.append("carry plan: one `run` per line, back to back (a machine goes back 30 s after a call):")
    lines += carry_plan(manifest, tree, out_rel, out / "warpcache.tar.xz")
    (out / "plan.txt").write_text("\n".join(table + lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
