"""Tests for warp_meshad._src.app.registry's scene names and the loader's did-you-mean for an unknown scene."""

import pytest

from warp_meshad.__main__ import main
from warp_meshad._src.app.config import ConfigError
from warp_meshad._src.app.loader import load_config
from warp_meshad._src.app.registry import available_configs, close_scenes, configs_root, scene_names


def test_scene_names_are_the_shipped_files():
    names = scene_names()
    files = sorted(p.relative_to(configs_root()).with_suffix("").as_posix() for p in configs_root().glob("*/*.yaml"))
    assert names == files
    assert {"cloth/hanging", "param/armadillo", "param/patches"} <= set(names)
    assert sum(len(v) for v in available_configs().values()) == len(names)


@pytest.mark.parametrize("name,expected", [
    ("param/armadilo", ["param/armadillo"]),            # a typo in the scene
    ("armadillo", ["param/armadillo"]),                 # the scene without its app
    ("clth/hanging", ["cloth/hanging"]),                # a typo in the app
    ("cloth/hang", ["cloth/hanging"]),                  # a prefix: not 'cloth/drape' for the shared 'cloth/'
    ("hanging.yaml", ["cloth/hanging"]),                # a suffix
    ("smoothing/bunny", ["elastic/bunny", "param/bunny_cut"]),  # the scene under another app, closest first
    ("cloth/nope", []),
])
def test_close_scenes(name, expected):
    assert close_scenes(name) == expected


def test_close_scenes_prefers_the_named_app_and_keeps_n():
    # 'spot' is as close to spot_area (smoothing) as to spot_drop and spot_pile (shells): the named app's first
    assert close_scenes("shells/spot") == ["shells/spot_drop", "shells/spot_pile", "smoothing/spot_area"]
    assert close_scenes("smoothing/spot") == ["smoothing/spot_area", "shells/spot_drop", "shells/spot_pile"]
    assert close_scenes("spot", n=1) == ["shells/spot_drop"]  # no app named: by name among equals
    assert all(name in scene_names() for name in close_scenes("spot", n=10))


def test_unknown_scene_message_names_the_closest(capsys):
    with pytest.raises(ConfigError, match=r"config file not found; did you mean 'param/armadillo'\?"):
        load_config("param/armadilo")
    with pytest.raises(ConfigError, match=r"did you mean 'elastic/bunny' or 'param/bunny_cut'\?"):
        load_config("smoothing/bunny")
    # nothing close: the app's scenes where the name starts with an app, else the plain message
    with pytest.raises(ConfigError, match=r"app 'cloth' has the scenes drape, grid_1000, hanging \(give a path"):
        load_config("cloth/nope")
    with pytest.raises(ConfigError) as info:
        load_config("nothing/xyz")
    assert "did you mean" not in str(info.value) and "has the scenes" not in str(info.value)
    assert main(["run", "param/armadilo", "--test", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "error: param/armadilo: config file not found; did you mean 'param/armadillo'?" in err
