"""The generated sources pinned by tests/test_codegen_golden.py: every kernel mode x variant and the dual modules.

``render()`` produces them with the current generators; ``python tests/golden_cases.py --write`` rewrites the files
under tests/golden/ (only on purpose: a changed generated text changes Warp's module hashes, so users' compiled
kernels are rebuilt; name the change in the commit).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sys
from typing import Any

from warp_meshad.kernels import ad

GOLDEN = pathlib.Path(__file__).parent / "golden"

# term shapes: (valence, dim, dtype, has_data, residual_dim, param_count)
SHAPES = {
    "v2d3f64data": (2, 3, "float64", True, 0, 0),
    "v3d2f32": (3, 2, "float32", False, 0, 0),
    "v4d1f64data": (4, 1, "float64", True, 0, 0),
    "v4d3f64": (4, 3, "float64", False, 0, 0),
    "v3d3f64res3": (3, 3, "float64", True, 3, 0),
    "v2d1f32res1": (2, 1, "float32", False, 1, 0),
    "v2d3f64par2": (2, 3, "float64", True, 0, 2),
}
# deformation-gradient terms (add_deformation_term): (valence, dim, dtype, has_data); F 3x3, 3x2 (columns), 2x2
DEFORMATION = {
    "F_v4d3f64data": (4, 3, "float64", True),
    "F_v3d3f64": (3, 3, "float64", False),
    "F_v3d2f32data": (3, 2, "float32", True),
}
SCALAR_MODES = ("probe", "energy", "gradient", "hessian", "hessian_proj", "hvp")
RESIDUAL_MODES = ("probe", "energy", "residual", "jacobian", "gauss_newton", "gradient", "hessian")
TILED_MODES = ("hessian", "hessian_proj")
REDUCED_MODES = ("energy", "gradient")  # the energy summed per thread block (contract.KernelVariant.reduced)
PROJECTION = "psd_scatter"  # the split projection's kernel (kernel_source.projection_source), not a mode

# dual modules kept as full text (the rest by digest): one of each kind of generated code; the packed modules of
# k = 3 and 12 show the projection's odd-even Jacobi steps for an odd and an even k
DUAL_FULL = (("plain", 0, "float64"), ("grad", 3, "float64"), ("hess", 4, "float32"), ("hess", 6, "float64"),
             ("hess", 12, "float64"), ("packed", 3, "float64"), ("packed", 12, "float64"))
DUAL_ALL = [("plain", 0, "float64")] + [
    (mode, k, dt) for mode in ("grad", "hess", "packed") for k in range(1, 13) for dt in ("float32", "float64")
] + [("packed", 13, "float64")]  # past UNROLLED_PROJECTION_MAX_K: the loop projection only


def kernel_cases():
    """(case name, shape name, mode, variant dict) for every kernel mode x variant."""
    cases = []
    for sname, shape in [*SHAPES.items(), *((n, (*s, 0, 0)) for n, s in DEFORMATION.items())]:
        res, params = shape[4] > 0, shape[5] > 0
        modes = RESIDUAL_MODES if res else SCALAR_MODES + (("mixed",) if params else ())
        for mode in modes:
            for det in (False, True):
                variants = [dict(deterministic=det)]
                if mode in REDUCED_MODES and not det:
                    variants.append(dict(reduced=True))
                if mode == "hessian_proj":
                    variants.append(dict(deterministic=det, unrolled=True))
                    variants.append(dict(deterministic=det, unrolled=True, split=True))
                if mode in TILED_MODES and not res:
                    for store in ("number", "block"):
                        variants.append(dict(deterministic=det, tiled=True, tile_store=store))
                        if mode == "hessian_proj":
                            variants.append(dict(deterministic=det, tiled=True, tile_store=store, unrolled=True))
                for v in variants:
                    tag = "_".join(k if val is True else f"{val}" for k, val in v.items() if val)
                    cases.append((f"{sname}.{mode}" + (f".{tag}" if tag else ""), sname, mode, v))
    # the split projection's kernel of each shape with a projected mode (kernel_source.projection_source)
    for sname, shape in [*SHAPES.items(), *((n, (*s, 0, 0)) for n, s in DEFORMATION.items())]:
        if shape[4] == 0:
            for det in (False, True):
                cases.append((f"{sname}.psd_scatter" + (".deterministic" if det else ""), sname, PROJECTION,
                              dict(deterministic=det)))
    # deformation terms with an analytic projection (contract.ANALYTIC_PROJECTION): listed last
    for sname in DEFORMATION:
        for det in (False, True):
            for v in (dict(deterministic=det, analytic=True),
                      dict(deterministic=det, tiled=True, tile_store="number", analytic=True)):  # fmt: skip
                tag = "_".join(k if val is True else f"{val}" for k, val in v.items() if val)
                cases.append((f"{sname}.hessian_proj.{tag}", sname, "hessian_proj", v))
    return cases


def render_kernel(sname: str, mode: str, variant: dict) -> str:
    import warp as wp

    from warp_meshad._src.codegen.contract import deformation_shape
    from warp_meshad._src.codegen.kernel_source import KernelSpec, kernel_source, projection_source

    if sname in DEFORMATION:
        valence, dim, dtype, has_data = DEFORMATION[sname]
        spec = KernelSpec(valence, dim, getattr(wp, dtype), has_data, deformation=deformation_shape(valence, dim))
    else:
        valence, dim, dtype, has_data, rdim, pcount = SHAPES[sname]
        spec = KernelSpec(valence, dim, getattr(wp, dtype), has_data, rdim, pcount)
    if mode == PROJECTION:
        return projection_source(spec, "kernel", **variant)
    return kernel_source(spec, mode, "kernel", **variant)


def render_dual(mode: str, k: int, dtype: str) -> str:
    from warp_meshad.kernels import _dualgen

    return _dualgen.source(k, dtype, mode)


def dual_name(mode, k, dtype) -> str:
    return "plain" if mode == "plain" else f"{mode}_{k}_{dtype}"


TERM_MODES = ("energy", "gradient", "hessian", "hessian_proj", "hvp")


def _golden_spring(e: int, xa: Any, xb: Any):
    """E = 1/2 (|xa - xb| - 1)^2 (a user's energy without data)."""
    l = ad.length(xa - xb)
    return 0.5 * (l - 1.0) * (l - 1.0)


def term_problems():
    """(name, problem, term index) of small problems with built-in and user energies (nothing compiled)."""
    import numpy as np
    import warp as wp

    import warp_meshad as wm
    from warp_meshad.kernels import energies as en

    global _golden_spring_fn
    if "_golden_spring_fn" not in globals():
        _golden_spring_fn = wp.func(_golden_spring)
    tri = wm.TriMesh.grid(2, 2)
    tet = wm.TetMesh.box(2, 2, 2)
    out = []
    for det in (False, True):
        tag = "_det" if det else ""
        p = wm.Problem(tri.vertex_count, 3, wp.float64, device="cpu", deterministic=det)
        out.append((f"user_spring{tag}", p, p.add_term(elements=tri.edges, energy=_golden_spring_fn)))
        p = wm.Problem(tri.vertex_count, 3, wp.float32, device="cpu", deterministic=det)
        rest = wp.array(np.ones(tri.edge_count, np.float32), dtype=wp.float32, device="cpu")
        data = en.MassSpringData(wp.float32, rest=rest, stiffness=2.0)
        out.append((f"mass_spring_float32{tag}", p, p.add_term(elements=tri.edges, energy=en.mass_spring, data=data)))
        p = wm.Problem(tri.vertex_count, 2, wp.float64, device="cpu", deterministic=det)
        data = en.SymmetricDirichletData(
            wp.float64,
            rest_inverse=wp.array(np.tile(np.eye(2), (tri.face_count, 1, 1)), dtype=wp.mat22d, device="cpu"),
            area=wp.array(np.full(tri.face_count, 0.5), dtype=wp.float64, device="cpu"),
        )
        out.append((f"symmetric_dirichlet{tag}", p, p.add_term(elements=tri.faces, energy=en.symmetric_dirichlet, data=data)))
        p = wm.Problem(tet.vertex_count, 3, wp.float64, device="cpu", deterministic=det)
        data = en.StableNeoHookeanData()
        data.rest_inverse = wp.array(tet.rest_matrix_inverses(), dtype=wp.mat33d, device="cpu")
        data.volume = wp.array(tet.volumes(), dtype=wp.float64, device="cpu")
        data.mu = wp.float64(1.0); data.lam = wp.float64(10.0)
        out.append((f"stable_neo_hookean{tag}", p, p.add_term(elements=tet.tets, energy=en.stable_neo_hookean, data=data)))
    return out


def term_kernel_names() -> dict[str, str]:
    """Name of every term kernel (it carries the digests of the rewritten energy, its module and the kernel text)."""
    from warp_meshad._src.codegen.kernel_cache import term_kernel

    out = {}
    for name, problem, t in term_problems():
        term = problem.terms[t]
        for mode in TERM_MODES:
            out[f"{name}.{mode}"] = term_kernel(term, mode, problem.kernel_facts).key
        for mode in REDUCED_MODES:
            out[f"{name}.{mode}.reduced"] = term_kernel(term, mode, problem.kernel_facts, reduced=True).key
    return out


def render() -> tuple[dict[str, str], dict[str, str]]:
    """(kernel sources by case, dual module sources by name)."""
    kernels = {name: render_kernel(s, m, v) for name, s, m, v in kernel_cases()}
    duals = {dual_name(*c): render_dual(*c) for c in DUAL_ALL}
    return kernels, duals


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write() -> None:
    kernels, duals = render()
    GOLDEN.mkdir(exist_ok=True)
    with open(GOLDEN / "kernel_sources.txt", "w") as f:
        for name, text in kernels.items():
            f.write(f"### {name}\n{text}")
    for c in DUAL_FULL:
        (GOLDEN / f"duals_{dual_name(*c)}.py.txt").write_text(duals[dual_name(*c)])
    manifest = {
        "duals": {n: digest(t) for n, t in duals.items()},
        "kernels": {n: digest(t) for n, t in kernels.items()},
        "term_kernel_names": term_kernel_names(),
    }
    (GOLDEN / "digests.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def read_kernel_goldens() -> dict[str, str]:
    out, name, lines = {}, None, []
    for line in (GOLDEN / "kernel_sources.txt").read_text().splitlines(keepends=True):
        if line.startswith("### "):
            if name is not None:
                out[name] = "".join(lines)
            name, lines = line[4:].strip(), []
        else:
            lines.append(line)
    if name is not None:
        out[name] = "".join(lines)
    return out


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
        print(f"wrote {GOLDEN}")
    else:
        print(__doc__)
