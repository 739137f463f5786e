"""OpenAI request bodies -> one validated `GenRequest`, and the OpenAI-style error.

Each field is checked by hand against a small table (type, range), so a bad field
gets a 400 whose message names the field, the value given and what is allowed,
the way the OpenAI API answers. It does not tokenize or render chat templates
(the engine does) and knows nothing about HTTP beyond the status code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


class APIError(Exception):
    """An error answered with an OpenAI-style body: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type, param, code)  # fmt: skip

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class GenRequest:
    """What one completion asks of the engine, whichever endpoint it came through."""

    prompt: str | list[int] | None = None  # /v1/completions: text or token ids
    messages: list[dict] | None = None  # /v1/chat/completions
    max_tokens: int | None = None  # None: up to the context
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(
            400, f"the request body is not valid JSON ({e})", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise APIError(
            400,
            f"the request body must be a JSON object, not {type(body).__name__}",
            code="invalid_json",
        )
    return body


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open=False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise bad(name, f"'{name}' must be a number, got {json.dumps(v)}")
    if v < lo or v > hi or (lo_open and v == lo):
        rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad(name, f"'{name}' must be in {rng}, got {v}")
    return float(v)


def _int(body: dict, name: str, lo: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"'{name}' must be an integer, got {json.dumps(v)}")
    if v < lo:
        raise bad(name, f"'{name}' must be at least {lo}, got {v}")
    return v


def _common(body: dict) -> GenRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"'model' must be a string, got {json.dumps(model)}")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise bad("n", f"'n' must be 1 (one choice per request), got {n}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise bad("stream", f"'stream' must be true or false, got {json.dumps(stream)}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("stream_options", "'stream_options' must be an object")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stop, list)
        or not all(isinstance(s, str) and s for s in stop)
        or len(stop) > 4
    ):
        raise bad("stop", "'stop' must be a non-empty string or a list of at most 4 of them")
    # max_completion_tokens is the newer name of the same limit in the chat API
    mt = _int(body, "max_tokens", 1)
    mt = mt if mt is not None else _int(body, "max_completion_tokens", 1)
    return GenRequest(
        max_tokens=mt,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        seed=_int(body, "seed", 0),
        stop=stop,
        stream=bool(stream),
        include_usage=bool(opts.get("include_usage", False)),
        model=model,
    )


def completion_request(body: dict) -> GenRequest:
    """A /v1/completions body: `prompt` is a string or a list of token ids."""
    req = _common(body)
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise bad("prompt", "'prompt' is empty")
    elif (
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
    ):
        pass
    else:
        raise bad(
            "prompt",
            "'prompt' must be a non-empty string or a list of token ids (one prompt per request)",
            code="invalid_type" if p is not None else "missing",
        )
    req.prompt = p
    return req


ROLES = ("system", "developer", "user", "assistant")


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in c
    ):
        return "".join(p["text"] for p in c)
    raise bad(
        f"messages[{i}].content",
        f"'messages[{i}].content' must be a string or a list of text parts",
    )


def chat_request(body: dict) -> GenRequest:
    """A /v1/chat/completions body: `messages` is a list of {role, content} with text content."""
    req = _common(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad(
            "messages",
            "'messages' must be a non-empty list of {role, content} objects",
            code="missing" if msgs is None else "invalid_type",
        )
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(
                f"messages[{i}].role", f"'messages[{i}].role' must be one of {', '.join(ROLES)}"
            )
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content(m, i)})
    req.messages = out
    return req
