"""The apps' YAML scenes, one folder per app (``configs/<app>/<scene>.yaml``), shipped as package data.

Mesh paths in them are relative to the file (``../../assets/meshes/spot.obj``): they resolve in a source checkout and
in an editable install (``pip install -e .``), which maps this folder in place; ``assets/`` is not part of a wheel.
"""
