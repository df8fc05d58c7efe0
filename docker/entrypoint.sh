#!/bin/sh
# Entry point of the ovex image. First argument picks the role:
#   serve  (default) the API; with OVEX_DEMO=1 and an empty models volume, trains the demo model first
#   worker           a training worker (scale with `docker compose up --scale worker=N`)
#   anything else    run as a command, e.g. `ovex train ...` or `sh`
set -eu

role="${1:-serve}"
[ "$#" -gt 0 ] && shift

case "$role" in
  serve)
    if [ "${OVEX_DEMO:-0}" = "1" ] && [ -z "$(ls -A "${OVEX_MODELS_DIR:-/models}" 2>/dev/null)" ]; then
      echo "ovex-entrypoint: no model in ${OVEX_MODELS_DIR:-/models}; training the demo model" >&2
      ovex demo --prepare-only
    fi
    exec ovex serve "$@"
    ;;
  worker)
    exec ovex worker "$@"
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
