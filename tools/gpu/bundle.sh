#!/usr/bin/env bash
# Build the wheel bundle for the lent GPU host into .gpu/ (ignored by git), from any folder:
#   bash tools/gpu/bundle.sh                           # the cudss and apps extras, as `pip install ".[cudss,apps]"`
#   bash tools/gpu/bundle.sh --extras cudss,apps,batch # with Ray;  --help for the rest
# pip resolves the project for the host (Python 3.12, manylinux x86-64); what the host already has at a version that
# meets the requirements is left out, the rest is packed unmodified as .gpu/wheels.partNN with .gpu/manifest.json.
# It prints every choice with its reason and the carry plan (also in .gpu/plan.txt): which `run` call carries which
# part. On the host, tools/gpu/remote.sh gathers the parts and installs them (tools/gpu/README.md).
set -eu
cd "$(dirname "$0")/../.."
exec python -m tools.gpu.bundle "$@"
