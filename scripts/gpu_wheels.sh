#!/usr/bin/env bash
# Fills .whl/ with what scripts/gpu_check.sh needs on a GPU machine that has torch, transformers and peft but no
# package index (cp312). Ray's wheel (79 MB) is over what one device call carries (64 MiB), so Ray travels as an
# xz tarball of the unpacked wheel without its Java jars, RLlib, ray.llm and the dashboard's source maps, which
# no part of gpu_check imports (~26 MB). antlr4 4.9.3 has no wheel: it travels as a tarball of this .venv's copy
# (pure Python). Takes ~2 minutes, most of it xz.
#     bash scripts/gpu_wheels.sh            # then name .whl in the device call's carry
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
W=.whl
mkdir -p "$W"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
download() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$1" "${@:2}"; }
download "$W" hydra-core==1.3.2 omegaconf==2.3.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 cloudpickle dill \
  megatron-core==0.16.1 jsonschema jsonschema-specifications referencing rpds-py datasets==5.2.0 multiprocess
if [[ ! -f $W/ray312.tar.xz ]]; then
  tmp=$(mktemp -d)
  download "$tmp" ray==2.60.0
  (cd "$tmp" && unzip -q ray-*.whl && rm -rf ray-*.whl ray/jars ray/rllib ray/llm ray/dashboard/client/build/static/js/*.map &&
    tar cf - ray ray-*.dist-info | xz -T0 -9 >ray312.tar.xz)
  mv "$tmp/ray312.tar.xz" "$W/" && rm -rf "$tmp"
fi
site=$("$PY" -c "import antlr4, os; print(os.path.dirname(os.path.dirname(antlr4.__file__)))")
tar cJf "$W/antlr4.tar.xz" -C "$site" antlr4 "$(basename "$(ls -d "$site"/antlr4_python3_runtime-*.dist-info)")"
du -sh "$W"
