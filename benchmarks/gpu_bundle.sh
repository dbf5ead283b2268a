#!/usr/bin/env bash
# Pack what the offline GPU host lacks into .gpu/ (ignored by git), from the project root:
#   bash benchmarks/gpu_bundle.sh
# - ../shared/tools/gpu_bundle.py: Warp, cuDSS + nvmath-python, and the wheels of the apps (pydantic, qdldl, trimesh)
#   and of the Ray runner, as zip parts of at most 40 MB (.gpu/<stem>.partNN);
# - .gpu/raydeps/: small wheels the host may lack (pydantic's typing_inspection and annotated_types, meshio and its
#   rich, Ray's jsonschema and msgpack, ...) and install.sh, which extracts into /tmp/site only those whose module
#   the host cannot import (session 13's first call lacked typing_inspection: 9 test modules failed to import).
# Transfer (one `run` per line, back to back; the working tree + one call's carry must stay under 64 MiB):
#   warp.part00 | warp.part01 | cudss.part00 | cudss.part01 + nvmath.part00 + .gpu/raydeps (cp to /tmp/gpu/raydeps)
#   | [ray.part00 | ray.part01] | the rest (warp.part02, cudss.part02, pydantic*, qdldl, trimesh) with the command:
#   cp .gpu/*.part0* /tmp/gpu/; bash benchmarks/gpu_session.sh -- true; bash /tmp/gpu/raydeps/install.sh; ...
set -eu
cd "$(dirname "$0")/.."
python ../shared/tools/gpu_bundle.py --cudss --extra pydantic==2.13.4 --extra pydantic_core==2.46.4 \
  --extra qdldl==0.1.9.post1 --extra trimesh==5.2.0 --extra ray==2.60.0
mkdir -p .gpu/raydeps
pip download --no-deps -q -d .gpu/raydeps --python-version 3.12 --platform manylinux2014_x86_64 --only-binary=:all: \
  msgpack click protobuf jsonschema jsonschema-specifications referencing rpds-py attrs typing-inspection \
  annotated-types typing-extensions meshio rich markdown-it-py mdurl pygments
cat > .gpu/raydeps/install.sh <<'SH'
# extract each wheel here into /tmp/site only where the host lacks its module
cd "$(dirname "$0")"
for pair in attrs:attr click:click jsonschema-:jsonschema jsonschema_specifications:jsonschema_specifications \
    msgpack:msgpack protobuf:google.protobuf referencing:referencing rpds_py:rpds typing_inspection:typing_inspection \
    annotated_types:annotated_types typing_extensions:typing_extensions meshio:meshio rich:rich \
    markdown_it:markdown_it mdurl:mdurl pygments:pygments; do
  stem=${pair%%:*}; mod=${pair##*:}
  python3 -c "import $mod" 2>/dev/null && continue
  for w in ${stem}*.whl; do echo "extract $w"; python3 -m zipfile -e "$w" /tmp/site; done
done
SH
ls -la .gpu
