"""The HTTP face of the engine: OpenAI's /v1/completions, /v1/chat/completions and /v1/models.

Built on Starlette (an ASGI toolkit, the layer FastAPI itself is made of), served by
uvicorn: both are widely used and maintained, and Starlette gives routing, request
bodies and streaming responses without the schema machinery FastAPI adds, which a
handful of hand-checked fields (requests.py) do not need.

Requests run one at a time (the engine has one pair of caches): a `Gate` admits
one running and `queue` waiting requests and answers 429 at once beyond that.
Every decoding step runs in a worker thread, so the event loop keeps noticing
disconnects (a stream's next step starts while its last chunk is being sent); a
client that goes away stops its generation after the current step, and the job's
`finally` leaves the caches consistent. Errors have OpenAI's shape.
One model per server: a request naming another `model` gets OpenAI's 404
(`model_not_found`, naming the one it holds; a request without `model` is served), and
`max_tokens` past the context is cut to what fits (as mlx_lm.server does).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import deque

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from apps.server.engine import Engine, Job
from apps.server.requests import APIError, GenRequest, chat_request, completion_request, parse_json


class Gate:
    """One request at a time, `queue` more waiting; beyond that `enter` fails at once (429)."""

    def __init__(self, queue: int):
        self.lock = asyncio.Lock()
        self.limit = 1 + queue
        self.inside = 0  # running + waiting

    async def enter(self) -> None:
        if self.inside >= self.limit:
            raise APIError(
                429,
                f"the server is busy ({self.limit - 1} requests already wait); retry later",
                type="rate_limit_error",
                code="queue_full",
            )
        self.inside += 1
        try:
            await self.lock.acquire()
        except BaseException:
            self.inside -= 1
            raise

    def leave(self) -> None:
        self.lock.release()
        self.inside -= 1


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class Server:
    """Routes bound to one engine; `app` is the ASGI application."""

    def __init__(self, engine: Engine, *, api_key: str | None = None, queue: int = 8):
        self.engine, self.api_key, self.gate = engine, api_key, Gate(queue)
        self.created = int(time.time())
        self.worker = anyio.CapacityLimiter(1)  # decoding steps run on one thread at a time
        self.recent: deque[dict] = deque(maxlen=16)  # how the last requests ended, for /health
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
            ],
            exception_handlers={
                404: self.not_found,
                405: self.not_allowed,
                Exception: self.internal_error,
            },
        )

    # ---- plumbing ----------------------------------------------------------

    async def not_found(self, request: Request, exc) -> JSONResponse:
        return error_response(APIError(404, f"no route {request.url.path}", code="not_found"))

    async def not_allowed(self, request: Request, exc) -> JSONResponse:
        return error_response(
            APIError(405, f"{request.method} is not allowed on {request.url.path}")
        )

    async def internal_error(self, request: Request, exc: Exception) -> JSONResponse:
        """A bug of ours still answers in OpenAI's shape (uvicorn logs the traceback)."""
        msg = f"internal error: {type(exc).__name__}: {exc}"
        return error_response(APIError(500, msg, type="server_error", code="internal_error"))

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if given != f"Bearer {self.api_key}":
            raise APIError(
                401,
                "Incorrect API key provided; pass it as 'Authorization: Bearer KEY'",
                type="authentication_error",
                code="invalid_api_key",
            )

    def check_model(self, model: str | None) -> None:
        """A 404 in OpenAI's shape for a model this server does not hold."""
        held = [self.engine.model_id]
        if model is not None and model not in held:
            raise APIError(
                404,
                f"The model '{model}' does not exist on this server; it holds "
                f"{', '.join(repr(m) for m in held)}",
                param="model",
                code="model_not_found",
            )

    async def step(self, job: Job) -> str | None:
        """The text of the job's next step, or None when it is done (runs in the worker thread)."""
        return await anyio.to_thread.run_sync(next, job, None, limiter=self.worker)

    async def finish(self, job: Job) -> None:
        """Close the job (shielded: it runs even when the request was cancelled) and let the next
        in."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(job.close, limiter=self.worker)
        self.recent.append({"finish": job.finish, "completion_tokens": len(job.out)})
        self.gate.leave()

    # ---- endpoints ---------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        """Liveness, as llama-server's /health, plus how the last requests ended (oldest first)."""
        return JSONResponse(
            {"status": "ok", "waiting": max(0, self.gate.inside - 1), "recent": list(self.recent)}
        )

    async def models(self, request: Request) -> JSONResponse:
        try:
            self.check_key(request)
        except APIError as e:
            return error_response(e)
        e = self.engine
        card = {"id": e.model_id, "object": "model", "created": self.created, "owned_by": "duet",
                "context_length": e.context, "method": e.method}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request: Request):
        return await self.serve(request, completion_request, "text_completion")

    async def chat(self, request: Request):
        return await self.serve(request, chat_request, "chat.completion")

    async def serve(self, request: Request, parse, kind: str):
        try:
            self.check_key(request)
            req = parse(parse_json(await request.body()))
            self.check_model(req.model)
            ids = await anyio.to_thread.run_sync(self.engine.prompt_ids, req, limiter=self.worker)
            await self.gate.enter()
        except APIError as e:
            return error_response(e)
        try:  # on the worker thread: reusing the kept ids decodes them (engine.reuse)
            job = await anyio.to_thread.run_sync(self.engine.job, ids, req, limiter=self.worker)
        except BaseException:
            self.gate.leave()
            raise
        rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex[:24]
        if req.stream:
            pump = Pump(job, self.worker)
            return GenerationStream(self, job, pump, self.chunks(pump, job, req, rid, kind))
        try:
            while await self.step(job) is not None:
                if await request.is_disconnected():
                    break
        finally:
            await self.finish(job)
        return JSONResponse(self.body(job, req, rid, kind))

    # ---- response bodies ---------------------------------------------------

    def choice(self, kind: str, text: str, finish: str | None, delta: bool) -> dict:
        if kind == "chat.completion":
            msg = {"role": "assistant", "content": text}
            key = "delta" if delta else "message"
            return {"index": 0, key: msg, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def body(self, job: Job, req: GenRequest, rid: str, kind: str) -> dict:
        c = self.choice(kind, job.text, job.finish or "stop", delta=False)
        c["token_ids"] = job.out  # as vLLM's return_token_ids: what was generated, EOS included
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.engine.model_id,
            "choices": [c],
            "usage": job.usage(),
        }

    async def chunks(self, pump: Pump, job: Job, req: GenRequest, rid: str, kind: str):
        """Server-sent events: one chunk per step that adds text, a last one with the finish."""
        obj = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"
        head = {
            "id": rid,
            "object": obj,
            "created": int(time.time()),
            "model": self.engine.model_id,
        }

        def event(choices: list, **extra) -> bytes:
            return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n".encode()

        async for text in pump.texts():
            if text:
                yield event([self.choice(kind, text, None, delta=True)])
        c = self.choice(kind, "", job.finish or "stop", delta=True)
        c["token_ids"] = job.out
        if kind == "chat.completion":
            c["delta"] = {}
        yield event([c])
        if req.include_usage:
            yield event([], usage=job.usage())
        yield b"data: [DONE]\n\n"


class Pump:
    """Runs a streaming job on the worker thread, handing each step's text to the event loop.

    The next step starts while the previous chunk is still being sent, so the network
    never holds the engine up; `stop` ends it after the step under way.
    """

    def __init__(self, job: Job, worker: anyio.CapacityLimiter):
        self.job, self.worker = job, worker
        self.halt = threading.Event()
        self.task: asyncio.Future | None = None

    async def texts(self):
        """Each step's text, as the worker thread produces them."""
        loop, q = asyncio.get_running_loop(), asyncio.Queue()

        def run() -> None:
            try:
                for text in self.job:
                    loop.call_soon_threadsafe(q.put_nowait, text)
                    if self.halt.is_set():
                        return
            finally:
                loop.call_soon_threadsafe(q.put_nowait, None)

        self.task = asyncio.ensure_future(anyio.to_thread.run_sync(run, limiter=self.worker))
        while (text := await q.get()) is not None:
            yield text
        await self.task  # a step's error surfaces here

    async def stop(self) -> None:
        """Stop after the step under way and wait for the worker thread to let go of the job."""
        self.halt.set()
        if self.task is not None:
            with anyio.CancelScope(shield=True):
                await asyncio.wait([self.task])


class GenerationStream(StreamingResponse):
    """A streaming response that closes its job however the stream ends (done, error,
    disconnect)."""

    def __init__(self, server: Server, job: Job, pump: Pump, chunks):
        super().__init__(
            chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self.server, self.job, self.pump = server, job, pump

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.pump.stop()
            await self.server.finish(self.job)
