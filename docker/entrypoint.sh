#!/bin/sh
# Entry point of the ovex image. First argument picks the role:
#   serve  (default) the API; with OVEX_DEMO=1, first trains the demo model if the volume lacks it
#   worker           a training worker (scale with `docker compose up --scale worker=N`)
#   anything else    run as a command, e.g. `ovex train ...` or `sh`
set -eu

role="${1:-serve}"
[ "$#" -gt 0 ] && shift

case "$role" in
  serve)
    if [ "${OVEX_DEMO:-0}" = "1" ]; then
      # `ovex demo` trains the demo model into the models volume once (if absent), then serves everything
      exec ovex demo "$@"
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
