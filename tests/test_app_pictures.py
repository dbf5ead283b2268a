"""What a person sees (issue 21 points 10-12): param's final.obj carries its uv coordinates and its scene the uv
layouts; every coloured quantity is named with its units and its screenshot gets a colour bar of that name, colour
map and range; convergence.png draws time steps one line per step with the step boundaries marked. The data drawn is
tested, not pixels."""

import os
import pathlib
import re

import numpy as np
import pytest

from warp_meshad import app as appmod
from warp_meshad._src.app.outputs import convergence_figure
from warp_meshad._src.app.viewer import ColorBar, add_colorbar, colorbar_figure, first_colorbar, scalar_range
from warp_meshad.app import load_config
from warp_meshad.app import run as run_app

pytestmark = pytest.mark.device

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")  # apps run on the test device
SCENES = ["arap/homer", "cloth/hanging", "elastic/bar_twist", "frame_field/fandisk", "manifold_opt/sphere_newton",
          "param/bunny_cut", "shells/spot_drop", "smoothing/spot_area"]


def small_app(scene: str, **overrides):
    """The scene's app at its test size on the test device, built but not run."""
    config = load_config(ROOT / "configs" / f"{scene}.yaml", test=True,
                         overrides={"screenshot": False, "device": DEVICE, **overrides})
    return appmod.app_class(config.app)(config)


def fake_history(energies: list[list[float]], gradient_norms: list[list[float]], time_step: float = 0.5) -> list:
    return [{"step": k, "energies": e, "gradient_norms": g, "time": (k + 1) * time_step}
            for k, (e, g) in enumerate(zip(energies, gradient_norms))]


# -- point 10: param's uv ---------------------------------------------------------------------------------------------


def test_param_final_obj_has_one_vt_per_vertex_equal_to_its_uv(tmp_path):
    config = load_config(ROOT / "configs" / "param" / "bunny_cut.yaml", test=True,
                         overrides={"screenshot": False, "device": DEVICE, "output": str(tmp_path)})
    app = run_app(config, quiet=True).app
    lines = (tmp_path / "final.obj").read_text().splitlines()
    vt = np.array([[float(v) for v in ln.split()[1:]] for ln in lines if ln.startswith("vt ")])
    np.testing.assert_allclose(vt, app.uv_coordinates(), rtol=0, atol=0)  # written with 17 digits: exact
    faces = [ln.split()[1:] for ln in lines if ln.startswith("f ")]
    corners = np.array([[int(i) for i in c.split("/")] for f in faces for c in f])  # "v/vt": the same index
    np.testing.assert_array_equal(corners[:, 0], corners[:, 1])
    np.testing.assert_array_equal(corners[:, 0].reshape(-1, 3) - 1, app.mesh.faces)


def test_param_scene_shows_the_uv_layouts_beside_the_surface():
    ps = pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    from warp_meshad._src.app import viewer

    ps.set_use_prefs_file(False)
    ps.init("openGL_mock")
    ps.remove_all_structures()
    app = small_app("param/bunny_cut")
    ctl = viewer.ViewerController(app, ps, colorbars=True)
    assert ps.has_surface_mesh(viewer.UV_CHECKER_NAME) and ps.has_surface_mesh(viewer.UV_COLORS_NAME)
    surface_right = app.positions()[:, 0].max()
    for slot, layout in enumerate(ctl.structures[1:]):
        flat = viewer._flat_layout(app.positions(), app.uv_coordinates(), slot)
        assert np.ptp(flat[:, 2]) == 0.0 and flat[:, 0].min() > surface_right  # flat, right of the surface
        # the layout is the uv map, scaled: its edges keep the uv edges' ratios
        e = app.mesh.edges
        uv_len = np.linalg.norm(app.uv_coordinates()[e[:, 0]] - app.uv_coordinates()[e[:, 1]], axis=1)
        flat_len = np.linalg.norm(flat[e[:, 0]] - flat[e[:, 1]], axis=1)
        np.testing.assert_allclose(flat_len / flat_len.max(), uv_len / uv_len.max(), rtol=1e-12, atol=1e-15)
        surface_right = flat[:, 0].max()
    ctl.refresh()  # new uv and quantities go to the three meshes
    ps.remove_all_structures()


# -- point 11: quantities with units, colour bars ----------------------------------------------------------------------


@pytest.mark.parametrize("scene", SCENES)
def test_every_quantity_is_named_with_its_units(scene):
    app = small_app(scene)
    quantities = app.quantities()
    assert quantities
    for name, (kind, values) in quantities.items():
        assert re.search(r"\S \[[^\]]+\]$", name), f"{scene}: quantity {name!r} names no unit in [...]"
    bar = first_colorbar(quantities)
    assert bar is not None and bar.label == next(n for n, (k, _) in quantities.items() if k in ("vertices", "faces"))


def test_colour_bar_beside_the_render_names_the_quantity():
    image = np.zeros((120, 200, 3), dtype=np.uint8)
    bar = ColorBar("speed [m/s]", 0.0, 2.5)
    fig = colorbar_figure(image, bar)
    image_ax, bar_ax = fig.axes
    assert bar_ax.get_ylabel() == "speed [m/s]" and bar_ax.get_ylim() == (0.0, 2.5)
    assert bar_ax.collections[0].get_cmap().name == "viridis"  # Polyscope's colour map of the same name
    out = add_colorbar(image, bar)
    assert out.shape[0] == 120 and out.shape[1] > 200 and out.shape[2] == 4 and out.dtype == np.uint8
    assert bar_ax.get_position().x0 * out.shape[1] >= 200 - 1  # the bar stands beside the render, not over it


def test_scalar_range_and_first_colour_bar():
    assert scalar_range([1.0, np.inf, 3.0, np.nan]) == (1.0, 3.0)  # a flipped face's infinite distortion left out
    assert scalar_range([2.0, 2.0]) == (1.0, 3.0)  # never empty
    assert scalar_range([np.inf]) == (0.0, 1.0)
    q = {"field [1]": ("face_vectors", np.ones((3, 3))), "curl [1]": ("faces", np.array([0.5, 1.5, 1.0])),
         "other [m]": ("vertices", np.zeros(4))}
    assert first_colorbar(q) == ColorBar("curl [1]", 0.5, 1.5)
    assert first_colorbar({"field [1]": ("face_vectors", np.ones((3, 3)))}) is None


# -- point 12: convergence.png ------------------------------------------------------------------------------------------


def test_time_steps_are_drawn_one_line_per_step_with_boundaries():
    history = fake_history([[5.0, 3.0, 2.5], [7.0, 6.0, 5.9, 5.8]], [[4.0, 1.0, 1e-3], [3.0, 0.5, 1e-2, 1e-6]])
    fig = convergence_figure(history, "cloth/test", per_step=True)
    ax_e, ax_g = fig.axes
    assert ax_e.get_yscale() == "log" and ax_g.get_yscale() == "log"
    lines = ax_e.get_lines()
    assert len(lines) == 2  # one per step: the energy above the step's final value, final point (0) left out
    np.testing.assert_allclose(lines[0].get_xdata(), [0, 1])
    np.testing.assert_allclose(lines[0].get_ydata(), [2.5, 0.5])
    np.testing.assert_allclose(lines[1].get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(lines[1].get_ydata(), [1.2, 0.2, 0.1], rtol=1e-12)
    assert [t.get_text() for t in ax_e.get_legend().get_texts()] == ["step 1 (t = 0.5 s)", "step 2 (t = 1 s)"]
    curves = [ln for ln in ax_g.get_lines() if ln.get_label() != "step boundary"]
    boundaries = [ln for ln in ax_g.get_lines() if ln.get_label() == "step boundary"]
    np.testing.assert_allclose(curves[0].get_xdata(), [0, 1, 2])  # the steps one after the other
    np.testing.assert_allclose(curves[1].get_xdata(), [3, 4, 5, 6])
    np.testing.assert_allclose(curves[1].get_ydata(), [3.0, 0.5, 1e-2, 1e-6])
    assert len(boundaries) == 1
    np.testing.assert_allclose(boundaries[0].get_xdata(), [2.5, 2.5])
    assert [t.get_text() for t in ax_g.get_legend().get_texts()] == ["step boundary"]


def test_many_time_steps_get_a_step_colour_bar_and_one_minimization_its_iterations():
    rng = np.random.default_rng(0)
    history = fake_history([sorted(rng.random(3), reverse=True) for _ in range(12)], [[1.0, 0.1, 0.01]] * 12)
    fig = convergence_figure(history, "elastic/test", per_step=True)
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel() == "step"  # 12 steps: a colour bar, not 12 legend rows
    # each step's curve a segment of one line collection (and its points one scatter); 11 step boundaries
    from matplotlib.collections import LineCollection

    e_curves = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    g_curves = [c for c in fig.axes[1].collections if isinstance(c, LineCollection)]
    assert [len(c.get_segments()) for c in e_curves] == [12]
    assert sorted(len(c.get_segments()) for c in g_curves) == [11, 12]
    np.testing.assert_allclose(e_curves[0].get_segments()[3][:, 1], np.asarray(history[3]["energies"][:-1])
                               - history[3]["energies"][-1])  # fmt: skip
    # one minimization in rounds: the rounds are concatenated (each round's start repeats the last end), log energy
    history = fake_history([[1000.0, 100.0, 20.0], [20.0, 5.0]], [[9.0, 1.0, 0.1], [0.1, 0.01]])
    ax_e, ax_g = convergence_figure(history, "param/test", per_step=False).axes
    (line,) = ax_e.get_lines()
    np.testing.assert_allclose(line.get_xdata(), [0, 1, 2, 3])
    np.testing.assert_allclose(line.get_ydata(), [1000.0, 100.0, 20.0, 5.0])
    assert ax_e.get_yscale() == "log" and ax_e.get_xlabel() == "iteration" and ax_e.get_ylabel() == "energy E"
    np.testing.assert_allclose(ax_g.get_lines()[0].get_ydata(), [9.0, 1.0, 0.1, 0.01])
