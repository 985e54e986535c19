"""Serve a checkpoint over HTTP with JSON (``cometnmt serve``), from the standard library alone.

Endpoints:

* ``GET /health``: ``{"status": "ok", "arch", "src_lang", "tgt_lang", "checkpoint", "decode"}``.
* ``POST /translate`` with ``{"text": "..."}`` (one sentence) or ``{"texts": ["...", ...]}`` and
  optionally ``beam``, ``nbest``, ``length_penalty``: ``{"translation": "..."}`` or
  ``{"translations": [...]}``; with ``nbest`` above 1 each translation is a list of
  ``{"text", "score"}``, best first.

Bad requests get status 400 (413 for a body over the size limit, 404/405 for other paths and
methods) and ``{"error": "..."}`` naming the field. Requests are handled in threads, the model
one request at a time (a lock), so a long batch delays the next request rather than racing it.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cometnmt.config import to_dict
from cometnmt.errors import CometNMTError, ConfigError
from cometnmt.inference import Translator

log = logging.getLogger(__name__)

_SETTINGS = ("beam", "nbest", "length_penalty")


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _request_texts(body: dict, max_sentences: int) -> tuple[list[str], bool]:
    """The sentences of a request and whether it sent one (``text``) rather than a list."""
    unknown = sorted(set(body) - {"text", "texts", *_SETTINGS})
    if unknown:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {', '.join(unknown)}; "
                                                   f"use text or texts, and optionally {', '.join(_SETTINGS)}")
    if ("text" in body) == ("texts" in body):
        raise RequestError(HTTPStatus.BAD_REQUEST, 'send exactly one of "text" (a string) or "texts" (a list of strings)')
    if "text" in body:
        if not isinstance(body["text"], str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"text" must be a string, got {type(body["text"]).__name__}')
        texts, single = [body["text"]], True
    else:
        texts, single = body["texts"], False
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError(HTTPStatus.BAD_REQUEST, '"texts" must be a list of strings')
        if len(texts) > max_sentences:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f'"texts" has {len(texts)} sentences, more than this server takes at once ({max_sentences})')
    for i, text in enumerate(texts):
        if "\n" in text or "\r" in text:
            where = '"text"' if single else f'"texts"[{i}]'
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{where} holds a line break; send one sentence per string")
    return texts, single


class TranslationServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` that translates with one :class:`Translator`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], translator: Translator, checkpoint: str, *,
                 max_sentences: int = 1000, max_body_bytes: int = 1 << 20) -> None:
        super().__init__(address, _Handler)
        self.translator, self.checkpoint = translator, checkpoint
        self.max_sentences, self.max_body_bytes = max_sentences, max_body_bytes
        self.lock = threading.Lock()

    def health(self) -> dict:
        cfg = self.translator.cfg
        return {"status": "ok", "arch": cfg.model.arch, "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang,
                "checkpoint": self.checkpoint, "decode": to_dict(cfg.decode)}

    def translate(self, body: object) -> dict:
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body must be a JSON object, got {type(body).__name__}")
        texts, single = _request_texts(body, self.max_sentences)
        settings = {k: body[k] for k in _SETTINGS if k in body}
        try:
            with self.lock:
                results = self.translator.translate(texts, **settings)
        except CometNMTError as exc:  # a bad setting or a sentence longer than the model's positions
            raise RequestError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        nbest = settings.get("nbest", self.translator.cfg.decode.nbest) > 1
        out = [[{"text": h.text, "score": h.score} for h in hyps] if nbest else hyps[0].text for hyps in results]
        return {"translation": out[0]} if single else {"translations": out}


class _Handler(BaseHTTPRequestHandler):
    server: TranslationServer
    protocol_version = "HTTP/1.1"

    def _send(self, status: HTTPStatus, payload: dict) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/health":
            self._send(HTTPStatus.OK, self.server.health())
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint {self.path}; use GET /health or POST /translate"})

    def do_POST(self) -> None:  # noqa: N802
        try:
            if self.path != "/translate":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {self.path}; use POST /translate")
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header") from None
            if length > self.server.max_body_bytes:
                self.close_connection = True  # the unread body must not be taken for the next request
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   f"the body has {length} bytes, more than this server takes ({self.server.max_body_bytes})")
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not valid UTF-8 (byte {exc.start})") from None
            except json.JSONDecodeError as exc:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON: {exc}") from None
            self._send(HTTPStatus.OK, self.server.translate(body))
        except RequestError as exc:
            self._send(exc.status, {"error": str(exc)})

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{self.command} is not supported; use GET /health or POST /translate"})

    do_PUT = do_DELETE = do_PATCH = _not_allowed

    def log_message(self, format: str, *args) -> None:  # through logging, not straight to stderr
        log.info("%s %s", self.address_string(), format % args)


def make_server(checkpoint: str, host: str = "127.0.0.1", port: int = 8080, device: str = "auto", *,
                beam: int | None = None, nbest: int | None = None, length_penalty: float | None = None,
                batch_size: int | None = None, max_sentences: int = 1000, max_body_bytes: int = 1 << 20,
                flags: bool = False) -> TranslationServer:
    """Load ``checkpoint`` and bind the server (``port`` 0 picks a free port: ``server.server_port``).
    ``beam``, ``nbest``, ``length_penalty`` and ``batch_size`` replace the checkpoint's search
    settings as the default of every request. Call ``serve_forever()`` on the result to serve."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{'--port ' if flags else 'port='}{port}: must be a port number, 0 to 65535")
    if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
        raise ConfigError(f"{'--max-sentences ' if flags else 'max_sentences='}{max_sentences}: must be at least 1")
    translator = Translator.from_checkpoint(checkpoint, device)
    translator.cfg.decode = translator._decode(None, flags=flags, beam=beam, nbest=nbest, length_penalty=length_penalty,
                                               batch_size=batch_size)
    try:
        return TranslationServer((host, port), translator, str(checkpoint), max_sentences=max_sentences,
                                 max_body_bytes=max_body_bytes)
    except OSError as exc:
        raise CometNMTError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
