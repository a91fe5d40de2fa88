"""The chat page: / (static/chat.html) and its own files under /static/ (its script, its style, the vendored browser
libraries of static/vendor/, listed with their versions and licences in static/vendor/README.md).

Every file is read once, at startup, and served from memory under one Content-Security-Policy that lets the page load
nothing from elsewhere and run no inline script. The page's files are open (no API key: a <script src> cannot send
one, and they hold no data), by exact path: a path under /static/ that names no file is not open, so it gets the
same 401-before-404 as any other unknown path (app.Gate)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

STATIC = Path(__file__).parent / "static"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".woff2": "font/woff2"}
# self only; inline style attributes stay allowed (KaTeX positions its glyphs with them), inline script does not
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# the page's files by URL path: every .js, .css and .woff2 under static/
PAGE_FILES = {"/static/" + path.relative_to(STATIC).as_posix(): path for path in sorted(STATIC.rglob("*"))
              if path.suffix in TYPES and path.is_file()}


def add_page_routes(app: FastAPI) -> None:
    page = (STATIC / "chat.html").read_bytes()
    files = {url: _entry(path.read_bytes(), TYPES[path.suffix]) for url, path in PAGE_FILES.items()}
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}

    @app.get("/", include_in_schema=False)
    async def chat_page():
        """The chat page (ortinf/serve/static/chat.html)."""
        return Response(page, media_type="text/html; charset=utf-8", headers={**headers, "Cache-Control": "no-cache"})

    @app.get("/static/{name:path}", include_in_schema=False)
    async def page_file(name: str, request: Request):
        """One of the chat page's files, revalidated by its ETag on each load (304 when unchanged)."""
        found = files.get("/static/" + name)
        if found is None:
            return Response("no such file", status_code=404, media_type="text/plain; charset=utf-8", headers=headers)
        body, media_type, etag = found
        cache = {**headers, "Cache-Control": "no-cache", "ETag": etag}
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=cache)
        return Response(body, media_type=media_type, headers=cache)


def _entry(body: bytes, media_type: str) -> tuple[bytes, str, str]:
    return body, media_type, '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
