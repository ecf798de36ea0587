"""The dashboard's web side: Starlette routes, server-sent events, and the uvicorn server.

Pages are HTML shells (Jinja templates) whose scripts read JSON from ``/api/...`` and redraw when
a notice arrives on ``/events`` (server-sent events; the browser's EventSource reconnects by
itself). Every route is a GET: nothing on the dashboard can change a request.

Scripts and styles are served from this package (``static/``) and from the installed ``plotly``
package (``/vendor/plotly.min.js``): no CDN, nothing fetched at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ftbus.dashboard import leaderboard, views
from ftbus.dashboard.state import DashboardState
from shared import metrics
from shared.events import CAMPAIGN_NAME, RequestId
from shared.logs import get_logger
from shared.settings import Settings

log = get_logger("ftbus.dashboard")

HERE = Path(__file__).resolve().parent
TEMPLATES = Jinja2Templates(directory=str(HERE / "templates"))
_REQUEST_ID = RequestId.__metadata__[0].pattern  # type: ignore[attr-defined]


def plotly_js() -> Path:
    """plotly.js as shipped inside the plotly wheel (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the plotly package is not installed (make install)")
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the plotly package")
    return path


def _valid_id(request_id: str) -> str:
    import re

    if not re.fullmatch(_REQUEST_ID, request_id):
        raise HTTPException(404, "no such request")
    return request_id


def _valid_campaign(name: str) -> str:
    import re

    if not re.fullmatch(CAMPAIGN_NAME, name):
        raise HTTPException(404, "no such campaign")
    return name


def build_app(state: DashboardState, closing: asyncio.Event | None = None) -> Starlette:
    closing = closing or asyncio.Event()

    def page(name: str, request: Request, **context: Any) -> Response:
        return TEMPLATES.TemplateResponse(request, name, {"active": name.split(".")[0], **context})

    async def overview_page(request: Request) -> Response:
        return page("overview.html", request)

    async def request_page(request: Request) -> Response:
        return page("request.html", request, request_id=_valid_id(request.path_params["request_id"]))

    async def leaderboard_page(request: Request) -> Response:
        return page("leaderboard.html", request)

    async def dead_letters_page(request: Request) -> Response:
        return page("dead_letters.html", request)

    async def campaigns_page(request: Request) -> Response:
        return page("campaigns.html", request)

    async def campaign_page(request: Request) -> Response:
        return page("campaign.html", request, campaign=_valid_campaign(request.path_params["name"]))

    async def api_campaigns(request: Request) -> Response:
        return JSONResponse({"campaigns": views.campaign_rows(await state.campaigns())})

    async def api_campaign(request: Request) -> Response:
        record = await state.campaign(_valid_campaign(request.path_params["name"]))
        if record is None:
            return JSONResponse({"error": "unknown campaign"}, status_code=404)
        return JSONResponse(views.campaign_detail(record))

    async def api_overview(request: Request) -> Response:
        return JSONResponse(state.overview())

    async def api_request(request: Request) -> Response:
        detail = await state.request_detail(_valid_id(request.path_params["request_id"]))
        if detail is None:
            return JSONResponse({"error": "unknown request", "ready": state.records_ready.is_set()}, status_code=404)
        return JSONResponse(detail)

    async def boards() -> list[dict[str, Any]]:
        # In a thread: the first paired comparisons of a large board take a while (then they are cached),
        # and the other pages and the event stream must not wait for them.
        return await asyncio.to_thread(leaderboard.leaderboard, list(state.records.values()))

    async def api_leaderboard(request: Request) -> Response:
        return JSONResponse({"boards": await boards()})

    async def leaderboard_json(request: Request) -> Response:
        body = json.dumps({"boards": await boards()}, indent=2)
        return Response(body, media_type="application/json",
                        headers={"Content-Disposition": 'attachment; filename="ftbus-leaderboard.json"'})

    async def leaderboard_csv(request: Request) -> Response:
        body = leaderboard.leaderboard_csv(await boards())
        return Response(body, media_type="text/csv",
                        headers={"Content-Disposition": 'attachment; filename="ftbus-leaderboard.csv"'})

    async def api_dead_letters(request: Request) -> Response:
        rows = await state.dead_letter_rows()
        return JSONResponse({"total": state.dead_letters, "dead_letters": [r.to_json() for r in rows]})

    async def stage_log(request: Request) -> Response:
        rid = _valid_id(request.path_params["request_id"])
        name = request.path_params["name"]
        if name not in dict(views.LOG_FILES):
            raise HTTPException(404, "no such log")
        data = await state.read_log(rid, name)
        if data is None:
            raise HTTPException(404, "no such log")
        return PlainTextResponse(data.decode("utf-8", errors="replace"))

    async def vendor_plotly(request: Request) -> Response:
        return FileResponse(plotly_js(), media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[ServerSentEvent]:
            async with state.hub.listen() as queue:
                yield ServerSentEvent(data=json.dumps({"type": "hello", **state.connection()}), event="notice")
                while not closing.is_set():
                    try:
                        notice = await asyncio.wait_for(queue.get(), timeout=1.0)
                    except TimeoutError:
                        continue
                    yield ServerSentEvent(data=json.dumps(notice), event="notice")

        return EventSourceResponse(stream(), ping=10)

    async def prometheus_metrics(request: Request) -> Response:
        """This process's Prometheus metrics (docs/operations.md, "Metrics")."""
        if not state.settings.metrics_enabled:
            raise HTTPException(404, "metrics are off (metrics_enabled)")
        body, content_type = metrics.exposition()
        return Response(body, headers={"Content-Type": content_type})

    async def healthz(request: Request) -> Response:
        conn = state.connection()
        return JSONResponse({"ok": conn["connected"], **conn}, status_code=200 if conn["connected"] else 503)

    routes = [
        Route("/", overview_page),
        Route("/requests/{request_id}", request_page),
        Route("/requests/{request_id}/logs/{name}", stage_log),
        Route("/leaderboard", leaderboard_page),
        Route("/dead-letters", dead_letters_page),
        Route("/campaigns", campaigns_page),
        Route("/campaigns/{name}", campaign_page),
        Route("/api/campaigns", api_campaigns),
        Route("/api/campaigns/{name}", api_campaign),
        Route("/api/overview", api_overview),
        Route("/api/requests/{request_id}", api_request),
        Route("/api/leaderboard", api_leaderboard),
        Route("/api/dead-letters", api_dead_letters),
        Route("/leaderboard.json", leaderboard_json),
        Route("/leaderboard.csv", leaderboard_csv),
        Route("/events", events),
        Route("/healthz", healthz),
        Route("/metrics", prometheus_metrics),
        Route("/vendor/plotly.min.js", vendor_plotly),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Starlette(routes=routes)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the process that embeds it (``ftbus up``) owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class DashboardServer:
    """The dashboard in this process's event loop: ``await start()`` returns its URL."""

    def __init__(self, settings: Settings, nats_url: str | None = None, *, host: str | None = None,
                 port: int | None = None) -> None:
        self.settings = settings
        self.host = host or settings.dashboard_host
        self.port = settings.dashboard_port if port is None else port
        self.state = DashboardState(settings, nats_url)
        self._closing = asyncio.Event()
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    def _bind(self, fallback: bool) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            if not fallback or self.port == 0:
                sock.close()
                raise
            log.warning("dashboard port busy: using a free one", port=self.port, error=str(exc))
            sock.bind((self.host, 0))
        sock.set_inheritable(True)
        return sock

    async def start(self, *, fallback_port: bool = False) -> str:
        sock = self._bind(fallback_port)
        port = sock.getsockname()[1]
        try:
            await self.state.start()
        except BaseException:
            sock.close()
            raise
        config = uvicorn.Config(
            build_app(self.state, self._closing), log_level="warning", lifespan="off", access_log=False,
            timeout_graceful_shutdown=3,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="dashboard-http")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the dashboard's HTTP server stopped at start")
            if loop.time() > deadline:
                raise RuntimeError("the dashboard's HTTP server did not start within 30 s")
            await asyncio.sleep(0.05)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{port}/"
        log.info("dashboard serving", url=self.url)
        return self.url

    async def stop(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=10)
        await self.state.stop()

    async def wait(self) -> None:
        """Until the HTTP server stops by itself."""
        if self._task is not None:
            await self._task
