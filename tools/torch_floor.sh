#!/usr/bin/env bash
# The lowest PyTorch of the package's range (pyproject.toml: torch>=2.9,<3), tried once by hand; not part of the
# test command. PyPI has no CPU-only Linux build of torch 2.9: its wheel (900 MB) pulls CUDA libraries, 3.8 GB in
# all, which this script downloads once into $DOWNLOADS. It then makes a venv with that torch and the other pins of
# requirements.txt and requirements-test.txt, and runs
#   1. the unit tests (every tests/test_*.py but those that build wheels, start JupyterLab or a browser, grade a
#      class, or re-check the generated editions, which do not depend on torch's version), then
#   2. every chapter, executed in the reduced-training setting (TRANSFORMER_LAB_QUICK=1) under nbval-lax: each cell
#      must run without an error; the stored outputs come from torch 2.13 and are not compared.
# Usage: bash tools/torch_floor.sh [VERSION]        (default 2.9.0; run from the repository root, one thread)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-2.9.0}"
downloads="${DOWNLOADS:-/tmp/torch-$version-wheels}"
venv="${VENV:-/tmp/venv-torch-$version}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python3.11 -m pip download -q "torch==$version" -d "$downloads"
python3.11 -m venv "$venv"
"$venv/bin/pip" install -q --no-index --find-links "$downloads" "torch==$version"
grep -v '^torch==\|^-r' requirements.txt requirements-test.txt | sed 's/^[^:]*://' > "$venv/requirements.txt"
"$venv/bin/pip" install -q -r "$venv/requirements.txt" "torch==$version" --find-links "$downloads"
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
tests=$(ls tests/test_*.py | grep -v -E 'browser|site|wheel|hosted|test_lab|classroom|grading|locale_gbk|binder|uv_options|teacher_pack|editions|translation|timing_asserts|prose_figures|i18n|encodings|no_posix')
PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -p no:cacheprovider $tests
TRANSFORMER_LAB_QUICK=1 PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -p no:cacheprovider --nbval-lax \
    --nbval-current-env notebooks/solutions/[0-9][0-9]_*.ipynb
