#!/bin/sh
# Runs pytest for ctest under the checkout's venv (ROOT/.venv, where the
# README installs torch and scipy), else under FALLBACK_PYTHON; skips with
# exit status 77, saying why, when that interpreter lacks a module the tests
# need.
#
#   venv_pytest.sh ROOT FALLBACK_PYTHON "MODULE MODULE ..." PYTEST_ARGS...
root=$1
py="$root/.venv/bin/python"
[ -x "$py" ] || py=$2
modules=$3
shift 3
for m in $modules; do
  if ! "$py" -c "import $m" 2> /dev/null; then
    echo "skipped: $py has no $m (python3 -m venv .venv; .venv/bin/pip install $modules)"
    exit 77
  fi
done
exec "$py" -m pytest -q -rs -p no:cacheprovider "$@"
