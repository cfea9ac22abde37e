#!/usr/bin/env bash
# Each peer server in its own venv under bench/peers/<name>/.venv: never a project dependency.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
for peer in "$@"; do
  if [ -f "$peer/.venv/.installed" ] && [ "$peer/.venv/.installed" -nt "$peer/requirements.txt" ]; then
    continue
  fi
  echo "setting up $peer (bench/peers/$peer/.venv)" >&2
  rm -rf "$peer/.venv"
  "$PYTHON" -m venv "$peer/.venv"
  "$peer/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$peer/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$peer/requirements.txt"
  touch "$peer/.venv/.installed"
done
