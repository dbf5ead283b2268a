"""The apps' pictures of the docs site, from real runs: each app's scene below is run headless on the CPU (or the
device given) and its ``screenshot.png`` (Polyscope through EGL) is copied to ``docs/assets/apps/<app>.png``, which
the app's page then shows.

Run: python docs/make_pictures.py [--device cuda:0] [--test] [app ...]

Each scene runs at its full size unless it is marked for its test size here (or ``--test`` asks for every one):
the pictures are of finished runs, in seconds to a minute each on a CPU. A run that cannot render (no EGL) says so
and leaves that picture as it was.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PICTURES = ROOT / "docs" / "assets" / "apps"

# app -> (scene, run it at its test size)
SCENES = {
    "arap": ("arap/homer", False),
    "cloth": ("cloth/hanging", False),
    "elastic": ("elastic/bar_twist", False),
    "frame_field": ("frame_field/fandisk", False),
    "manifold_opt": ("manifold_opt/sphere_newton", False),
    "param": ("param/bunny_cut", False),
    "shells": ("shells/spot_drop", True),
    "smoothing": ("smoothing/spot_area", False),
}


def make(app: str, device: str, test: bool) -> bool:
    """Runs the app's scene and copies its screenshot; True when a picture was written."""
    scene, small = SCENES[app]
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "warp_meshad", "run", scene, "--device", device, "--headless", "--quiet",
                   "--output", out, "--set", "screenshot=true", *(["--test"] if small or test else [])]
        done = subprocess.run(command, cwd=ROOT)
        shot = pathlib.Path(out) / "screenshot.png"
        if done.returncode != 0 or not shot.exists():
            print(f"{app}: no picture ({' '.join(command[2:])} exited {done.returncode}"
                  f"{'' if shot.exists() else ', no screenshot.png'})", file=sys.stderr)
            return False
        PICTURES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, PICTURES / f"{app}.png")
        print(f"{app}: {scene}{' (test size)' if small or test else ''} -> {(PICTURES / f'{app}.png').relative_to(ROOT)}")
        return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("apps", nargs="*", help=f"apps to picture (default: all of {', '.join(SCENES)})")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--test", action="store_true", help="every scene at its test size")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.apps) - set(SCENES))
    if unknown:
        parser.error(f"unknown apps {unknown}; expected some of {sorted(SCENES)}")
    made = [make(app, args.device, args.test) for app in (args.apps or SCENES)]
    return 0 if all(made) else 1


if __name__ == "__main__":
    sys.exit(main())
