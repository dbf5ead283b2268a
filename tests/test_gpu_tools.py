"""The GPU host's wheel bundle without a GPU: parts and manifest (``tools.gpu.wheels``) on a set of small wheels made
here, gathered over several "calls", reassembled, checked against their sha256 and installed with pip; the host
check that picks fallbacks; and the bundle's choice of what to pack (``tools.gpu.bundle.decide``)."""

import base64
import hashlib
import json
import pathlib
import random
import re
import shutil
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tools` is a folder of the checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from tools.gpu import wheels  # noqa: E402


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: pathlib.Path, name: str, version: str, payload: bytes = b"", requires=()) -> pathlib.Path:
    """A pure-Python wheel of one module ``name`` holding ``payload`` (stored, so its size is about the payload's)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{name}/blob.bin": payload,
        f"{info}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name_in, data in files.items():
            z.writestr(name_in, data)
        z.writestr(f"{info}/RECORD", record)
    return path


def make_installed(site: pathlib.Path, name: str, version: str, requires=()) -> None:
    """A distribution as an installer leaves it: ``<name>-<version>.dist-info/METADATA`` in ``site``."""
    info = site / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


@pytest.fixture
def bundle(tmp_path):
    """Three wheels in parts of 50 kB: ``big`` (120 kB, over three parts), ``small``, and the fallback ``ext``."""
    src = tmp_path / "wheelhouse"
    src.mkdir()
    rng = random.Random(7)
    big = make_wheel(src, "big", "1.0", bytes(rng.getrandbits(8) for _ in range(120_000)))
    small = make_wheel(src, "small", "2.1", b"x" * 3000, requires=["ext>=4.16"])
    ext = make_wheel(src, "ext", "4.16.0", b"y" * 40_000)
    out = tmp_path / "bundle"
    manifest = wheels.pack(
        [{"path": big, "group": "wheels", "name": "big", "version": "1.0", "required_by": [["<project>", "big>=1"]]},
         {"path": small, "group": "wheels", "name": "small", "version": "2.1",
          "required_by": [["<project>", "small"]]},
         {"path": ext, "group": "fallback", "name": "ext", "version": "4.16.0",
          "required_by": [["small", "ext>=4.16"]]}],
        out, 50_000, host=[])
    return {"out": out, "manifest": manifest, "files": {"big": big, "small": small, "ext": ext}}


def test_pack_cuts_one_stream_into_parts_and_records_every_range(bundle):
    out, manifest, files = bundle["out"], bundle["manifest"], bundle["files"]
    assert json.loads((out / wheels.MANIFEST).read_text()) == manifest
    total = sum(p.stat().st_size for p in files.values())
    sizes = [manifest["parts"][name]["bytes"] for name in manifest["parts"]]
    assert list(manifest["parts"]) == [f"wheels.part{i:02d}" for i in range(len(sizes))]
    assert sum(sizes) == total and all(s == 50_000 for s in sizes[:-1]) and 0 < sizes[-1] <= 50_000
    for name, info in manifest["parts"].items():
        assert (out / name).stat().st_size == info["bytes"]
        assert wheels.sha256_file(out / name) == info["sha256"]
    by_name = {w["name"]: w for w in manifest["wheels"]}
    assert [len(by_name[n]["parts"]) for n in ("big", "small")] == [3, 1]
    for name, path in files.items():
        entry = by_name[name]
        assert entry["bytes"] == path.stat().st_size and entry["sha256"] == wheels.sha256_file(path)
        assert sum(r[2] for r in entry["parts"]) == entry["bytes"]
    # the fallback fills the last required part and spills into one that holds it alone
    ext_parts = [r[0] for r in by_name["ext"]["parts"]]
    assert {n: i["required"] for n, i in manifest["parts"].items() if n in ext_parts} == {
        ext_parts[0]: True, ext_parts[-1]: False}


def test_parts_gathered_call_by_call_reassemble_and_install(bundle, tmp_path):
    out, manifest, files = bundle["out"], bundle["manifest"], bundle["files"]
    gathered, host = tmp_path / "gathered", tmp_path / "host"
    host.mkdir()
    names = list(manifest["parts"])
    for i, name in enumerate(names):  # one call each: the tree carries the manifest and one part
        carried = tmp_path / f"call{i}"
        carried.mkdir()
        shutil.copy(out / wheels.MANIFEST, carried)
        shutil.copy(out / name, carried)
        received, missing = wheels.receive(carried, gathered)
        assert received == [name] and missing == names[i + 1:]
        if i == 0:  # not all parts yet: install refuses, naming what is missing
            assert wheels.install(gathered, tmp_path / "site", path=[str(host)]) == 3
    for name, path in files.items():
        entry = next(w for w in manifest["wheels"] if w["name"] == name)
        assert wheels.extract(entry, gathered, tmp_path / "re").read_bytes() == path.read_bytes()
    site = tmp_path / "site"
    # the host lacks ext: the fallback is installed beside the required wheels, by pip from the reassembled files
    assert wheels.install(gathered, site, path=[str(host)]) == 0
    versions = {n: wheels.installed_version(n, [str(site)]) for n in ("big", "small", "ext")}
    assert versions == {"big": "1.0", "small": "2.1", "ext": "4.16.0"}
    assert (site / "big" / "blob.bin").read_bytes() == zipfile.ZipFile(files["big"]).read("big/blob.bin")
    assert not (gathered / "wheels").exists()  # the reassembled wheels are removed once installed
    assert wheels.install(gathered, site, path=[str(host)]) == 0  # the stamp: installed already, nothing redone


def test_a_wrong_hash_is_refused_naming_the_file(bundle, tmp_path):
    out, manifest = bundle["out"], bundle["manifest"]
    big = next(w for w in manifest["wheels"] if w["name"] == "big")
    gathered = tmp_path / "gathered"
    wheels.receive(out, gathered)
    second = big["parts"][1][0]
    data = bytearray((gathered / second).read_bytes())
    data[100] ^= 0xFF
    (gathered / second).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"big-1\.0-py3-none-any\.whl: sha256 [0-9a-f]{64}, the manifest says"):
        wheels.extract(big, gathered, tmp_path / "re")
    assert not (tmp_path / "re" / big["file"]).exists()
    # the same part carried again is refused on arrival, naming the part
    carried = tmp_path / "carried"
    carried.mkdir()
    shutil.copy(out / wheels.MANIFEST, carried)
    (carried / second).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{second}: 50000 bytes with sha256 [0-9a-f]+; the manifest says"):
        wheels.receive(carried, tmp_path / "elsewhere")


def test_another_manifest_drops_the_parts_of_the_old_bundle(bundle, tmp_path):
    out = bundle["out"]
    gathered = tmp_path / "gathered"
    wheels.receive(out, gathered)
    other = tmp_path / "other"
    wheels.pack([{"path": bundle["files"]["small"], "group": "wheels", "name": "small", "version": "2.1",
                  "required_by": []}], other, 50_000)
    received, missing = wheels.receive(other, gathered)
    assert received == ["wheels.part00"] and missing == []
    assert sorted(p.name for p in gathered.glob("*.part*")) == ["wheels.part00"]
    assert wheels.sha256_file(gathered / "wheels.part00") == wheels.sha256_file(other / "wheels.part00")


def test_no_manifest_names_the_older_layout(tmp_path):
    (tmp_path / "warp.part00").write_bytes(b"old")
    with pytest.raises(FileNotFoundError, match=r"no bundle manifest \(found warp\.part00: parts of another layout\)"):
        wheels.receive(tmp_path, tmp_path / "gathered")


def _manifest(fallbacks=(), host=()):
    entry = {"group": "wheels", "name": "pydantic", "version": "2.14.4", "file": "pydantic.whl", "parts": [],
             "required_by": [["<project>", "pydantic>=2.6,<3"]]}
    return {"format": 1, "parts": {}, "wheels": [entry, *fallbacks], "host": list(host)}


def _fallback(name, required_by):
    return {"group": "fallback", "name": name, "version": "9", "file": f"{name}.whl", "parts": [],
            "required_by": required_by}


def test_choose_takes_a_fallback_only_where_an_installed_requirer_needs_it(tmp_path):
    host = tmp_path / "host"
    make_installed(host, "typing_extensions", "4.15.0")
    make_installed(host, "tqdm", "4.67.1")
    manifest = _manifest(fallbacks=[
        _fallback("typing-extensions", [["pydantic", "typing-extensions>=4.16.0"]]),
        _fallback("tqdm", [["<project>", "tqdm>=4.60"]]),  # the host's meets it
        _fallback("matplotlib", [["<project>", "matplotlib>=3.7"]]),  # missing on the host
        _fallback("pillow", [["matplotlib", "pillow>=9"]]),  # needed by the matplotlib fallback, taken above
        _fallback("tzdata", [["python-dateutil", "tzdata"]]),  # its requirer is not installed here
    ])
    chosen, notes, problems = wheels.choose(manifest, path=[str(host)])
    assert [w["name"] for w in chosen] == ["pydantic", "typing-extensions", "matplotlib", "pillow"]
    assert notes[0] == ("fallback typing-extensions.whl: typing-extensions 4.15.0 does not meet >=4.16.0 "
                        "(required by pydantic)")
    assert notes[1:] == ["fallback matplotlib.whl: matplotlib is not installed (required by <project>)",
                         "fallback pillow.whl: pillow is not installed (required by matplotlib)"]
    assert problems == []


def test_choose_checks_what_is_left_to_the_host_with_its_extras(tmp_path):
    host = tmp_path / "host"
    make_installed(host, "cuda-toolkit", "13.0.2", requires=['nvidia-cublas==13.0.*; extra == "cublas"'])
    make_installed(host, "nvidia-cublas", "13.0.2.9")
    make_installed(host, "numpy", "2.5.2")
    left = [{"name": "cuda-toolkit", "required_by": [["pydantic", "cuda-toolkit[cublas]==13.*"]]},
            {"name": "numpy", "required_by": [["pydantic", "numpy>=1.24"], ["cupy", "numpy<2.6"]]},
            {"name": "scipy", "required_by": [["trimesh", "scipy"]]}]  # trimesh is not installed: not checked
    assert wheels.choose(_manifest(host=left), path=[str(host)])[2] == []
    left[1]["required_by"].append(["<project>", "numpy>=2.6"])
    older = tmp_path / "older"
    make_installed(older, "cuda-toolkit", "13.0.2", requires=['nvidia-cublas==13.0.*; extra == "cublas"'])
    make_installed(older, "nvidia-cublas", "12.9.1")
    make_installed(older, "numpy", "2.5.2")
    problems = wheels.choose(_manifest(host=left), path=[str(older)])[2]
    assert [p.split(";")[0] for p in problems] == [
        "the host's cuda-toolkit: cuda-toolkit[cublas] needs nvidia-cublas==13.0.*: nvidia-cublas 12.9.1 does not "
        "meet ==13.0.* (required by pydantic)",
        "the host's numpy: numpy 2.5.2 does not meet >=2.6 (required by <project>)"]


def test_bundle_decide_follows_only_what_is_packed():
    bundle = pytest.importorskip("tools.gpu.bundle")
    from packaging.requirements import Requirement

    def dist(name, version, *requires):
        return bundle.Dist(name=name, version=version, requires=list(requires))

    dists = {d.name: d for d in [
        dist("numpy", "2.5.5"), dist("cupy-cuda13x", "14.2.0", "numpy<2.6"), dist("warp-lang", "1.19.0", "numpy"),
        dist("pydantic", "2.14.4", "typing-extensions>=4.16.0", 'pywin32; platform_system == "Windows"'),
        dist("typing-extensions", "4.16.0"), dist("rich", "15.0.0", "pygments>=2.13"), dist("pygments", "2.21.0"),
        dist("meshio", "5.3.5", "rich", "numpy>=1.20"), dist("huge", "1.0"),
        dist("matplotlib", "3.11.2", "python-dateutil>=2.7", "huge>=1"), dist("python-dateutil", "4.0.0", "tzdata"),
        dist("tzdata", "2026.6"), dist("scipy", "1.18.1")]}
    root = [Requirement(r) for r in ["warp-lang>=1.19,<1.20", "numpy>=1.24", "cupy-cuda13x>=13", "pydantic>=2.6,<3",
                                     "meshio>=5.3", "matplotlib>=3.7", "scipy>=1.19"]]
    sizes = {"huge": 500_000_000}
    choices = bundle.decide(dists, root, lambda d: sizes.get(d.name, 1000), 20_000_000,
                            host_versions={"numpy": "2.5.2", "cupy-cuda13x": "14.2.0", "scipy": "1.18.1"},
                            host_unrecorded={"typing-extensions", "rich", "pygments", "matplotlib", "python-dateutil",
                                             "huge"})
    roles = {name: c.role for name, c in choices.items()}
    assert roles == {
        "numpy": "host", "cupy-cuda13x": "host",  # recorded versions meeting every requirement
        "scipy": "wheels",  # the host's 1.18.1 misses >=1.19: packed, shadowing it
        "warp-lang": "wheels", "pydantic": "wheels", "meshio": "wheels",  # not on the host
        "typing-extensions": "fallback", "matplotlib": "fallback", "python-dateutil": "fallback",  # not recorded
        "rich": "host",  # not recorded, but any version will do
        "huge": "host",  # not recorded, over the fallback size
        "tzdata": "fallback",  # not on the host, needed only by a fallback
    }  # pygments is not followed: only rich, left to the host, requires it; cupy's numpy<2.6 counts for nothing
    assert choices["numpy"].required_by == [("<project>", "numpy>=1.24"), ("meshio", "numpy>=1.20"),
                                            ("warp-lang", "numpy")]
    assert choices["scipy"].why == "the host's 1.18.1 misses scipy>=1.19 (<project>): shadows it"
    forced = bundle.decide(dists, root, lambda d: 1000, 20_000_000, host_versions={"numpy": "2.5.2"},
                           host_unrecorded=set(), force={"numpy"})
    assert forced["numpy"].role == "wheels" and forced["numpy"].why == "packed on request (--pack)"
