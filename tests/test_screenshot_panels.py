"""param's screenshot (warp_meshad/_src/app/viewer.py): three panels, each framed on its own so no mesh is cut at a
panel's edge, under the titles of what they show, with the colour bar at the right. The framing and the layout of
the figure are tested as numbers; one real render (where EGL works) checks that every panel's side columns are
background."""

import pathlib

import numpy as np
import pytest

from warp_meshad._src.app import viewer

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _project(points, position, target, fov_deg, aspect):
    """Normalised device x, y in [-1, 1] of points seen by a perspective camera at ``position`` looking at
    ``target`` with +y up."""
    forward = (target - position) / np.linalg.norm(target - position)
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    rel = points - position
    depth = rel @ forward
    t = np.tan(0.5 * np.radians(fov_deg))
    return (rel @ right) / (depth * t * aspect), (rel @ up) / (depth * t)


@pytest.mark.parametrize("aspect", [1.0, 16 / 9, 0.6])
def test_front_camera_fits_the_box_and_fills_the_binding_side(aspect):
    rng = np.random.default_rng(4)
    for scale in ([3.0, 1.0, 0.5], [0.2, 2.0, 1.0], [1.0, 1.0, 0.0]):  # wide, tall, flat
        points = rng.uniform(-1.0, 1.0, (500, 3)) * scale + [5.0, -2.0, 1.0]
        lo, hi = points.min(axis=0), points.max(axis=0)
        corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
        position, target = viewer.front_camera(points, aspect, 45.0)
        np.testing.assert_allclose(target, 0.5 * (lo + hi))
        assert position[2] > hi[2]  # in front, looking along -z
        x, y = _project(corners, position, target, 45.0, aspect)
        assert np.abs(x).max() <= 1.0 / viewer.PANEL_MARGIN + 1e-12 and np.abs(y).max() <= 1.0 / viewer.PANEL_MARGIN + 1e-12
        np.testing.assert_allclose(max(np.abs(x).max(), np.abs(y).max()), 1.0 / viewer.PANEL_MARGIN, rtol=1e-12)


def test_panels_figure_titles_each_panel_and_puts_the_bar_right_of_them():
    images = [np.full((200, w, 3), 255, dtype=np.uint8) for w in (200, 200, 150)]
    bar = viewer.ColorBar("distortion [1]", 0.0, 2.0)
    fig = viewer.panels_figure(images, list(viewer.UV_PANEL_TITLES), bar)
    *panels, bar_ax = fig.axes
    assert [ax.get_title() for ax in panels] == ["surface (uv checker)", "uv layout (checker)", "uv layout (colours)"]
    assert bar_ax.get_ylabel() == "distortion [1]"
    top = viewer.title_row_height(200)
    width, height = fig.get_size_inches() * fig.dpi
    assert round(height) == 200 + top and round(width) > 550
    boxes = [ax.get_position() for ax in panels]
    for box, image in zip(boxes, images):  # each panel at its pixel size, below the title row, none overlapping
        np.testing.assert_allclose([box.width * width, box.height * height, box.y0], [image.shape[1], 200, 0.0],
                                   atol=1e-6)
    assert all(a.x1 <= b.x0 + 1e-9 for a, b in zip(boxes, boxes[1:]))
    assert bar_ax.get_position().x0 >= boxes[-1].x1
    pixels = viewer.figure_pixels(fig)
    assert pixels.shape == (200 + top, round(width), 4)
    assert (pixels[:top, : round(boxes[-1].x1 * width), :3] < 128).any()  # the titles are drawn in the top row
    single = viewer.colorbar_figure(images[0], bar)  # one render: no title row, as before
    assert round(single.get_size_inches()[1] * single.dpi) == 200 and len(single.axes) == 2
    with pytest.raises(ValueError, match="one title per image"):
        viewer.panels_figure(images, ["a"], bar)
    with pytest.raises(ValueError, match="one height"):
        viewer.panels_figure([images[0], np.zeros((100, 100, 3), np.uint8)], ["a", "b"], bar)


@pytest.mark.cpu
def test_param_screenshot_cuts_no_panel(tmp_path):
    pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    imread = pytest.importorskip("matplotlib.image").imread
    from warp_meshad.app import app_class, load_config

    config = load_config("param/bunny_cut", test=True, overrides={"screenshot": False, "device": "cpu"})
    app = app_class("param")(config)
    ok, why = viewer.screenshot(app, tmp_path / "screenshot.png")
    if not ok and why.startswith("headless rendering unavailable"):
        pytest.skip(f"no headless rendering here: {why}")
    assert ok, why
    image = imread(tmp_path / "screenshot.png")[..., :3]
    w, h = viewer.PANEL_SIZE
    top = viewer.title_row_height(h)
    assert image.shape[0] == h + top and image.shape[1] > 3 * w
    for i in range(3):
        panel = image[top:, i * w:(i + 1) * w]
        drawn = (panel < 0.95).any(axis=2)  # not the white background (the shadow is lighter than this)
        assert drawn.mean() > 0.05, f"panel {i} shows nothing"
        cols = np.flatnonzero(drawn.any(axis=0))
        rows = np.flatnonzero(drawn.any(axis=1))
        # the mesh stays off the panel's sides and bottom: it is not cut
        assert cols.min() > 5 and cols.max() < w - 6 and rows.max() < h - 6, (i, cols.min(), cols.max(), rows.max())
        assert (image[:top, i * w:(i + 1) * w] < 0.5).any(), f"panel {i} has no title"
