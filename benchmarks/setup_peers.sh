#!/usr/bin/env bash
# Create the peer venvs used by the benchmarks (git-ignored): benchmarks/.venvs/{ray,daft}.
#
#   bash benchmarks/setup_peers.sh          # both
#   bash benchmarks/setup_peers.sh ray      # one
#
# Each peer gets its own venv so its pins never touch the project venv: Daft pins pyarrow<26,
# which pip resolves inside the Daft venv. Ray Data's Dataset.join imports polars, which
# ray[data] does not pull in, so the Ray venv adds it. Neither pulls torch: the Ray venv gets the
# CPU build, torch==2.13.0+cpu (a label only the local CPU wheel matches, so it never pulls the
# multi-GB CUDA build; without that wheel Ray's torch benchmarks are skipped). Idempotent: pip skips
# what is already installed. Needs python3.11 on PATH (override with PYTHON=...).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
PYTHON="${PYTHON:-python3.11}"
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(ray daft)
mkdir -p "$VENVS"
for peer in "${peers[@]}"; do
  case "$peer" in
    ray)  pkgs=("ray[data]==2.60.0" pydantic aiohttp pyarrow pandas polars psutil) ;;
    daft) pkgs=(daft numpy psutil) ;;
    *) echo "unknown peer $peer (ray, daft)" >&2; exit 2 ;;
  esac
  [ -x "$VENVS/$peer/bin/python" ] || "$PYTHON" -m venv "$VENVS/$peer"
  "$VENVS/$peer/bin/pip" install --quiet "${pkgs[@]}"
  if [ "$peer" = ray ]; then
    "$VENVS/$peer/bin/pip" install --quiet "torch==2.13.0+cpu" || echo "no torch CPU wheel here: Ray's torch benchmarks will be skipped" >&2
  fi
  "$VENVS/$peer/bin/pip" check || true
  "$VENVS/$peer/bin/python" - "$peer" <<'PY'
import importlib.metadata as md, sys
peer = sys.argv[1]
names = {"ray": ["ray", "pyarrow", "pandas", "polars", "numpy"], "daft": ["daft", "pyarrow", "numpy"]}[peer]
print(peer, "venv:", ", ".join(f"{n} {md.version(n)}" for n in names))
PY
done
