"""The web console at `/` and the API docs at `/docs`, all served from local files.

Nothing is fetched from the internet: the console is plain HTML/CSS/JS in `service/console/`, and the
Swagger UI bundle comes from the `fastapi-offline` package's static folder. (No ReDoc page: its bundle
loads its logo from a CDN.)
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

CONSOLE_DIR = Path(__file__).resolve().parents[1] / "console"
DOCS_ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"


def install_console(app: FastAPI) -> None:
    """Mount the console's files and the docs assets; `/` answers the console's page."""
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR), name="console")
    app.mount("/docs-assets", StaticFiles(directory=DOCS_ASSETS), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/", include_in_schema=False)
    def console_page() -> FileResponse:
        return FileResponse(CONSOLE_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon.png",
            # the default validator badge would call an outside service
            swagger_ui_parameters={"validatorUrl": None, "tryItOutEnabled": True},
        )
