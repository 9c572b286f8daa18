#!/usr/bin/env bash
# The course's commands. Each one creates the virtual environment .venv on first use and
# installs the pinned requirements into it, so it works on a fresh machine with Python 3.11.
#
#   bash run.sh lab          set up, then open your own working copy of the course (my_notebooks/,
#                            made from the learner edition in notebooks/) in JupyterLab
#   bash run.sh lab zh       the same for the Chinese edition (中文版): my_notebooks/zh/, made from
#                            notebooks/zh/, in JupyterLab with its interface in Chinese
#                            (or TRANSFORMER_LAB_LANGUAGE=zh bash run.sh lab)
#   bash run.sh test         set up, then run every test: lint, unit tests, every notebook under
#                            strict nbval, the classroom checks, the browser test and the website
#   bash run.sh notebooks    re-execute the source edition (notebooks/solutions/) in place, each in a
#                            fresh kernel, then regenerate the learner edition (notebooks/) from it
#   bash run.sh site         build the course's website, both languages, from the committed notebooks
#                            (not executed) into _site/ (docs/site.md; GitHub Pages runs exactly this)
#
# Extra arguments are passed on (to jupyter lab, to pytest, to the notebook runner).
set -euo pipefail
cd "$(dirname "$0")"

VENV="${VENV:-.venv}"
PYTHON="$VENV/bin/python"

UV_VERSION=0.13.9  # the installer of the setup (from PyPI, by pip)

setup() {  # $1: the requirements file to install
    local fresh=0 stamp="$VENV/.byte-compiled" uv="$VENV/bin/uv" options=()
    if [ ! -x "$PYTHON" ]; then
        python3 -m venv "$VENV"
        fresh=1
    fi
    # uv installs the requirements, unpacking and byte-compiling on every core: a fresh setup took 68 s here (uv's
    # cache empty), against 141 s with pip alone. tools/uv_options.py hands it pip's configuration (find-links,
    # indexes, constraints), which uv does not read; uv-overrides.txt says what it leaves out and why. If uv cannot
    # be had or fails, pip installs instead.
    # Byte-compiled, not skipped: the graded answers' sandbox reads the environment read-only and
    # PYTHONDONTWRITEBYTECODE may be set, so every process would otherwise compile torch again from source. Files
    # that do not compile (templates some packages ship) are left uncompiled, as pip leaves them.
    local found=""
    if { [ -x "$uv" ] && [[ "$("$uv" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; } \
        || "$PYTHON" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"; then
        found="$("$PYTHON" tools/uv_options.py "$PYTHON")" || uv=""  # without pip's settings, no uv
        [ -z "$found" ] || mapfile -t options <<< "$found"
    else
        uv=""
    fi
    if [ -n "$uv" ] && "$uv" pip install --quiet --python "$PYTHON" "${options[@]}" --override uv-overrides.txt \
        --compile-bytecode -r "$1" \
        && "$uv" pip install --quiet --python "$PYTHON" "${options[@]}" --no-deps -e .; then
        [ "$fresh" = 0 ] || touch "$stamp"  # uv compiled all it installed, which in a new environment is all
    else
        echo "run.sh: installing with pip instead of uv (slower)" >&2
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile -r "$1"
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps -e .
        rm -f "$stamp"
    fi
    if [ ! -f "$stamp" ]; then
        "$PYTHON" -m compileall -q -j 0 "$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
            > /dev/null || true
        touch "$stamp"
    fi
}

# One thread per process: two PyTorch processes on two cores must not oversubscribe them,
# and the thread count changes the last digits of float results.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
    lab)
        language="${TRANSFORMER_LAB_LANGUAGE:-en}"
        if [ "${1:-}" = zh ] || [ "${1:-}" = en ]; then
            language="$1"
            shift
        fi
        case "$language" in  # checked before the set-up, so that a typo costs nothing; the command checks it too
            en|zh) ;;
            *) echo "run.sh lab: --language must be en or zh, got '$language' (en: English, zh: 中文)." >&2; exit 2 ;;
        esac
        setup requirements.txt
        # The rest is the package's own command, the same on every OS (transformer_lab/workspace.py): your working
        # copy (my_notebooks/, or my_notebooks/zh/), made on first use and kept in step with the course without
        # ever overwriting a chapter you changed; for zh, JupyterLab's interface in Chinese (its settings in
        # my_notebooks/.jupyter-zh/); then JupyterLab on chapter 00. As root it
        # says why JupyterLab refuses root and stops, unless you add --allow-root.
        exec "$PYTHON" -m transformer_lab.cli lab --language "$language" "$@"
        ;;
    test)
        # requirements-test.txt includes requirements-site.txt: tests/test_site.py builds the website as
        # `run.sh site` does (or reuses a _site/ built from the files as they are) and reads it in Chromium.
        setup requirements-test.txt
        "$VENV/bin/ruff" check .
        # pytest's own exit codes pass through: 5 (no test collected) is a failure here.
        # --max-worker-restart 0: a worker that dies fails the run at once (pytest-xdist 3.8's loadfile scheduler can
        # wait for ever after replacing a crashed worker, pytest-dev/pytest-xdist#784). The files go out in
        # pytest-xdist's own order, those with the most tests first: the longest-first order was measured slower
        # (a full run from a fresh clone: pytest 1402 s against 1157 s in this order).
        exec "$PYTHON" -m pytest -n 2 --dist loadfile --max-worker-restart 0 \
            --nbval --nbval-current-env \
            --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 300 "$@"
        ;;
    notebooks)
        setup requirements-test.txt
        "$PYTHON" tools/execute_notebooks.py "$@"
        "$PYTHON" tools/chapter_times.py      # each chapter's time, from its counts and the kernel time just measured
        exec "$PYTHON" tools/editions.py
        ;;
    site)
        setup requirements-site.txt
        exec "$PYTHON" tools/build_site.py "$@"
        ;;
    *)
        echo "usage: bash run.sh {lab|test|notebooks|site} [args...]" >&2
        exit 2
        ;;
esac
