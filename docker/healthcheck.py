"""Container healthcheck for both roles of the ovex image (API and worker).

One image serves both roles, so the check looks at the container's main process: an API is healthy when
`/readyz` answers 200; a worker when the job database (its queue) answers.
Exit 0 healthy, 1 unhealthy (Docker's convention).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path


def main_process_args() -> list[str]:
    try:
        raw = Path("/proc/1/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def check_api() -> str | None:
    port = os.environ.get("OVEX_PORT", "8000")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as resp:
            return None if resp.status == 200 else f"/readyz answered {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"/readyz answered {exc.code}"
    except OSError as exc:
        return f"/readyz unreachable: {exc}"


def check_worker() -> str | None:
    db_url = os.environ.get("OVEX_DB_URL", "")
    if db_url.startswith("postgresql"):
        import psycopg

        dsn = "postgresql://" + db_url.split("://", 1)[1]
        try:
            psycopg.connect(dsn, connect_timeout=3).close()
        except Exception as exc:
            return f"postgres: {exc}"
    return None


def main() -> int:
    args = main_process_args()
    problem = check_worker() if "worker" in args else check_api()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
