"""Serve a checkpoint over HTTP with JSON (``cometnmt serve``), from the standard library alone.

Endpoints:

* ``GET /health``: ``{"status": "ok", "arch", "src_lang", "tgt_lang", "checkpoint", "decode",
  "max_sentences", "max_beam", "max_chars", "batching"}``, ``batching`` being ``{"max_batch_sentences",
  "max_batch_padded_chars", "batch_wait_ms"}`` (and ``max_batch_chars``, the padded size's former key) or
  ``null`` when off (:meth:`TranslationServer.health`); ``HEAD`` answers as ``GET`` without the body
  (health checkers use it).
* ``POST /translate`` with ``{"text": "..."}`` (one sentence) or ``{"texts": ["...", ...]}`` and
  optionally ``beam``, ``nbest``, ``length_penalty``, ``sampling`` (true: random samples, ``nbest``
  of them; false: greedy search), ``topk``, ``topp``, ``temperature``, ``seed``, ``replace_unk``:
  ``{"translation": "..."}`` or ``{"translations": [...]}``; with ``nbest`` in the request (``1``
  included, as ``translate --nbest 1`` writes columns) or a server default above 1, each
  translation is a list of ``{"text", "score"}``, best first.
* ``POST /logprob`` with ``{"source": "...", "target": "..."}`` or ``{"sources": [...], "targets":
  [...]}``: forced decoding (:meth:`Translator.log_prob`), ``{"log_prob", "tokens", "unknown"}`` or
  ``{"scores": [...]}`` of them: each target's log-probability given its source (natural log, over
  its tokens and ``</s>``), e.g. to rerank another system's outputs.

A score or log-probability that is not a finite number (a model whose weights hold NaN) is
``null``: JSON has no NaN, and every answer is strict JSON.

A setting given as ``null`` keeps the server's default (the checkpoint's search, or the
command's ``--beam`` and friends); ``beam`` and ``nbest`` are capped (``--max-beam``, default 64),
since a beam's (or the samples') memory grows with its width. With a seed (the request's or the
server's) the same request gets the same samples. Bad requests get status 400 (411 without a
Content-Length, saying which JSON body the endpoint wants, 413 for too many sentences (``--max-sentences``, default 1000), a sentence of too many
characters (``--max-chars``, default 10,000: the RNN has no position limit, and one long sentence held
the model for hours) or too large a body (1 MiB), 415 for a compressed one (``Content-Encoding``) or one whose ``Content-Type`` is not
``application/json`` (a ``+json`` type and a UTF-8 charset are taken; a body without the header is taken if it is
JSON, then answered as any JSON body, 400 for a bad request; one that is no JSON, being empty, not UTF-8 or not
JSON, gets 415 saying to send Content-Type: application/json, where with that header it gets 400; each answer
says what to send), 408 for a body that stops
short of its Content-Length for a minute, 404/405 for other paths and methods; 501, 414 and 431
from http.server itself) and ``{"error": "..."}`` naming the field (one sentence of a list as
``"texts"[2]``, counted from 0 as JSON indexes it; a key given twice in one JSON object is refused, naming it, not resolved to its
last value); a query string is ignored. A
request whose length is ambiguous (two Content-Length headers, one that is not a number, a malformed header
line) gets 400 and its connection closed: behind a proxy that reads it otherwise, the rest would
be taken for the next request (request smuggling). ``Expect: 100-continue`` is answered with
``100 Continue`` only once those checks (and the size limit, path and method) have passed; any
other expectation gets 417 (RFC 9110) and its connection closed. A connection closed after a
refusal or with a body unread is drained first (a lingering close, :meth:`_Handler._drain`), so a
client still sending its body gets the answer, not a reset.
Requests are
handled in threads, the model one request at a time (a first-come, first-served lock,
:class:`FifoLock`), so a long batch delays the next request rather than racing it, and requests
get the model in the order they asked for it; one whose client has closed its connection by then is
not decoded (:meth:`TranslationServer.client_gone`). Concurrent /translate requests of the same search
are decoded together (dynamic batching, :class:`RequestBatcher`: ``--max-batch-sentences``,
``--max-batch-chars``, the padded size: sentences x the longest's characters, ``--batch-wait-ms``),
each answered with its own translations: a request that finds the model free is decoded at once
(with what is queued then), and those arriving meanwhile form the next batch; ``--batch-wait-ms``
bounds a wait for more while the model is busy, and is no delay. Sentences not in Unicode NFC
are translated as they are, with a warning in the log at most once a minute
(``--nfc-warning-interval``), counting those in between (:class:`NfcWarnings`).
"""

from __future__ import annotations

import dataclasses
import email.errors
import io
import json
import logging
import math
import re
import selectors
import socket
import sys
import threading
import time
import unicodedata
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from cometnmt.config import to_dict
from cometnmt.data.corpus import nul_note, other_encoding
from cometnmt.errors import CometNMTError, ConfigError, setting
from cometnmt.inference import Translator, checkpoint_list, read_from_files

log = logging.getLogger(__name__)

_SETTINGS = ("beam", "nbest", "length_penalty", "sampling", "topk", "topp", "temperature", "seed", "replace_unk")
_POST = {"/translate": "translate", "/logprob": "log_prob"}  # route -> TranslationServer method
_GONE = "the client closed its connection while the request waited for the model; not decoded"
# language -> a sentence for the example bodies of error messages (Multi30k's languages); another gets a neutral one
_FIELDS = {"/translate": '"text": a sentence, or "texts": a list of them',  # route -> what its body holds
           "/logprob": '"source" and "target", or "sources" and "targets"'}
_EXAMPLE_SENTENCES = {"de": "Ein Hund.", "en": "A dog.", "fr": "Un chien.", "cs": "Pes."}


class FifoLock:
    """A lock handed to its waiters in the order they asked for it (a ticket lock).

    ``threading.Lock`` promises no order: a thread that releases it and asks again at once (a
    client's next request on a kept-alive connection) usually takes it back before a thread already
    waiting wakes up, so under load one busy client could keep the model and others wait without
    bound."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._next_ticket = 0  # the ticket the next thread to ask gets
        self._serving = 0  # the ticket that holds the lock (or gets it next)

    def waiting(self) -> int:
        """How many threads hold or wait for the lock."""
        with self._turn:
            return self._next_ticket - self._serving

    def __enter__(self) -> "FifoLock":
        with self._turn:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._turn.wait()
        return self

    def __exit__(self, *exc) -> None:
        with self._turn:
            self._serving += 1
            self._turn.notify_all()


class NfcWarnings:
    """Warnings of request text not in Unicode NFC (decomposed accents, as macOS writes them: its
    words are not the vocabulary's precomposed ones), at most one per ``interval`` seconds. The
    Translator warned once per call, so a client sending such text logged a warning with every
    request (1,000 requests, 1,000 warnings), in the Python API's words ("Translator.translate
    texts: ... sentence 1"). Now the first such request is warned of at once, naming the field;
    later ones within ``interval`` are counted, and the next warning (or :meth:`flush`, when the
    server closes) says how many requests and sentences there were since the last. ``interval`` 0
    warns of every such request."""

    def __init__(self, interval: float = 60.0, clock=time.monotonic) -> None:
        self.interval, self._clock = interval, clock
        self._lock = threading.Lock()
        self._last: float | None = None  # when the last warning was logged
        self._requests = self._sentences = 0  # requests (and their sentences) not in NFC since then, not yet logged

    def check(self, route: str, fields: dict[str, list[str]], single: bool) -> None:
        """Note one request's sentences (``fields``: its field -> their sentences, as a list even
        for ``single``, a request of one ``text``) and warn if it is time."""
        bad = [(field, i) for field, texts in fields.items() for i, text in enumerate(texts)
               if not unicodedata.is_normalized("NFC", text)]
        if not bad:
            return
        with self._lock:
            self._requests, self._sentences = self._requests + 1, self._sentences + len(bad)
            now = self._clock()
            if self._last is not None and now - self._last < self.interval:
                return
            requests, sentences, self._requests, self._sentences, self._last = self._requests, self._sentences, 0, 0, now
        field, i = bad[0]
        first = f'"{field[:-1]}"' if single else f'"{field}"[{i}]'
        earlier = ""
        if requests > 1:
            earlier = (f"; {requests - 1} earlier request{'s' * (requests > 2)} ({sentences - len(bad)} sentence"
                       f"{'s' * (sentences - len(bad) != 1)}) held such text too since the last warning")
        every = f"; this warning is logged at most once every {self.interval:g} s" if self.interval > 0 else ""
        log.warning("POST %s: %d sentence%s not in Unicode NFC (first: %s), e.g. accents as separate combining "
                    "characters; they do not match the same words written precomposed: the client should normalise "
                    "its text (NFC)%s%s", route, len(bad), " is" if len(bad) == 1 else "s are", first, earlier, every)

    def flush(self) -> None:
        """Log the requests not in NFC counted since the last warning, if any (the server is closing)."""
        with self._lock:
            requests, sentences, self._requests, self._sentences = self._requests, self._sentences, 0, 0
        if requests:
            log.warning("%d more request%s (%d sentence%s) held text not in Unicode NFC since the last warning", requests,
                        "s" * (requests != 1), sentences, "s" * (sentences != 1))


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers  # headers: the answer's own (Accept-Encoding with a 415, say)


def _request_texts(body: dict, max_sentences: int, max_chars: int) -> tuple[list[str], bool]:
    """The sentences of a request and whether it sent one (``text``) rather than a list."""
    unknown = sorted(set(body) - {"text", "texts", *_SETTINGS})
    if unknown:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {', '.join(unknown)}; "
                                                   f"use text or texts, and optionally {', '.join(_SETTINGS)}")
    if ("text" in body) == ("texts" in body):
        raise RequestError(HTTPStatus.BAD_REQUEST, 'send exactly one of "text" (a string) or "texts" (a list of strings)')
    if "text" in body:
        if not isinstance(body["text"], str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"text" must be a string, got {_json_type(body["text"])}')
        texts, single = [body["text"]], True
    else:
        texts, single = body["texts"], False
        _check_strings(texts, "texts")
        if len(texts) > max_sentences:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f'"texts" has {len(texts)} sentences, more than this server takes at once ({max_sentences})')
    for i, text in enumerate(texts):  # a carriage return is text, as for Translator
        _check_text(text, '"text"' if single else f'"texts"[{i}]', max_chars)
    return texts, single


def _json_type(value: object) -> str:
    """A decoded JSON value's type as JSON names it: errors said Python's ("got NoneType" for null,
    "got dict" for an object), which a client in another language need not know."""
    if isinstance(value, bool):
        return "a boolean"
    names = {type(None): "null", int: "a number", float: "a number", str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _check_strings(value: object, field: str) -> None:
    """``value`` (the request's ``field``) is a list of strings; else an error naming the first item
    that is not one (``"texts"[1] must be a string, got a number``), where it named none."""
    if not isinstance(value, list):
        raise RequestError(HTTPStatus.BAD_REQUEST, f'"{field}" must be a list of strings, got {_json_type(value)}')
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"{field}"[{i}] must be a string, got {_json_type(item)}')


def _utf16_hint(raw: bytes) -> str:
    """For a body holding NUL bytes (JSON in UTF-16, as .NET's and PowerShell's strings are: 'not
    valid JSON: Expecting property name enclosed in double quotes' without a BOM, 'not valid UTF-8
    (byte 0)' with one): what it is and what to send instead."""
    if b"\0" not in raw:
        return ""
    return "; it holds NUL bytes, as UTF-16 text does: send the JSON in UTF-8 (RFC 8259 8.1)"


def _latin1_hint(raw: bytes, pos: int) -> str:
    """For a body not valid UTF-8 at byte ``pos`` that looks like WINDOWS-1252 (Latin-1, a client's
    default encoding: '{"text": "Gr\\xf6\\xdfe"}'), as the file readers name it: what it is and what
    to send instead; it was 'the body is not valid UTF-8 (byte 12)' alone."""
    if other_encoding(raw, pos) != "WINDOWS-1252":
        return ""
    return "; it looks like WINDOWS-1252 (Latin-1): send the JSON in UTF-8 (RFC 8259 8.1)"


def _form_hint(raw: bytes, example: str) -> str:
    """For a body that is not JSON but an HTML form's fields (``text=Ein+Hund.``, as ``curl -d
    text=...`` or Python requests' ``data={...}`` send): how to send JSON instead (``example``, a
    body of the endpoint: :meth:`TranslationServer.example`)."""
    if not re.match(rb"[A-Za-z_][\w.-]*=", raw):
        return ""
    return ('; it looks form-encoded (name=value): send a JSON object, e.g. curl -H "Content-Type: application/json" '
            f"-d '{example}', or requests.post(url, json={example})")


_JSON_CHARSETS = ("utf-8", "utf8", "us-ascii")  # JSON is UTF-8 (RFC 8259 8.1); ASCII is a part of it


def _check_content_type(values: list[str]) -> None:
    """A body's ``Content-Type`` header (``values``: each one sent) must say JSON: ``application/json``
    (or a ``+json`` type), with a UTF-8 charset if any. It was not read: a body sent as text/plain or
    application/xml was decoded as JSON all the same, and one that was no JSON got "not valid JSON",
    where a 415 names the type that was sent and the one wanted. Without the header the body is read
    as JSON (RFC 9110 8.3 lets the server look at the data): http.client and raw sockets send none."""
    if not values:
        return
    sent = ", ".join(values)
    media, _, params = sent.partition(";")
    media = media.strip(" \t").lower()
    if media != "application/json" and not re.fullmatch(r"application/[^/,\s]+\+json", media):
        hint = ""
        if media == "application/x-www-form-urlencoded":  # curl -d's and urllib's type, requests' data=, an HTML form's
            hint = ('; curl -d sends that type unless told otherwise: add -H "Content-Type: application/json" (Python: '
                    "requests.post(url, json={...}), or urllib.request.Request(url, data, headers={\"Content-Type\": "
                    '"application/json"}))')
        raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type {sent!r}: this server reads JSON; send the "
                                                              f"body with Content-Type: application/json{hint}",
                           {"Accept-Post": "application/json"})
    charset = re.search(r'(?:^|;)[ \t]*charset[ \t]*=[ \t]*"?([^";, \t]*)', params, re.IGNORECASE)
    if charset and charset.group(1).lower() not in _JSON_CHARSETS:
        raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type {sent!r}: this server reads JSON as UTF-8 "
                                                              "(RFC 8259); send the body in UTF-8, with Content-Type: "
                                                              "application/json or application/json; charset=utf-8",
                           {"Accept-Post": "application/json; charset=utf-8"})


def _check_text(text: str, where: str, max_chars: int) -> None:
    """One sentence of a request, named as the request has it (``where``: ``"texts"[2]``, 0-based as
    JSON counts): no newline, UTF-8 (no lone surrogate, which JSON's \\ud800 can carry), no NUL
    character (``\\u0000``: UTF-16 text decoded as UTF-8, as the Translator refuses it), and at most
    ``max_chars`` characters. The Translator's own checks said "sentence 3", counting from 1 and
    naming no field. The length is checked here, before the model's lock: only the Transformer
    family has a position limit, and one sentence as long as the body allows held an RNN's lock for
    hours (its search runs 1.5 x source length + 10 steps, each attending over the whole source;
    8,000 words took 38 s, 2,000 words with beam 64 took 1.4 GB)."""
    if "\n" in text:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{where} holds a newline; send one sentence per string")
    if len(text) > max_chars:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"{where} has {len(text)} characters, more than this "
                                                                f"server takes in one sentence ({max_chars})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{where} is not valid Unicode (a lone surrogate at "
                                                   f"column {exc.start + 1})") from None
    if note := nul_note(text):  # "\u0000" in the JSON: UTF-16 text decoded as UTF-8 by the client
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{where} {note}")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object of the body, each key once: json.loads kept a repeated key's last value
    without a word, so ``{"texts": [...], "texts": [...]}`` translated the second list alone."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body's JSON gives the key {json.dumps(key, ensure_ascii=False)} "
                                                       "twice in one object; send it once")
        out[key] = value
    return out


_LINE = re.compile(r"(input|source|target) line (\d+): ")  # Translator's errors about one sentence, counting from 1


def _name_field(message: str, fields: dict[str, str], single: bool) -> str:
    """A Translator error about one sentence ("input line 3: ...") naming it as the request does
    (``"texts"[2]: ...``), so every error about a sentence counts from 0 as JSON does; ``fields``
    maps the Translator's word for the side to the request's list field."""
    match = _LINE.match(message)
    if not match or match.group(1) not in fields:
        return message
    field = fields[match.group(1)]
    where = f'"{field[:-1]}"' if single else f'"{field}"[{int(match.group(2)) - 1}]'
    return f"{where}: {message[match.end():]}"


def _request_pairs(body: dict, max_sentences: int, max_chars: int) -> tuple[list[str], list[str], bool]:
    """The (source, target) pairs of a /logprob request and whether it sent one (``source`` and
    ``target``) rather than lists (``sources`` and ``targets``)."""
    unknown = sorted(set(body) - {"source", "target", "sources", "targets"})
    one, many = {"source", "target"} & set(body), {"sources", "targets"} & set(body)
    if unknown or not ((len(one) == 2 and not many) or (len(many) == 2 and not one)):
        extra = f"; unknown field(s) {', '.join(unknown)}" if unknown else ""
        raise RequestError(HTTPStatus.BAD_REQUEST, 'send "source" and "target" (strings), or "sources" and "targets" '
                                                   f"(lists of strings, one target per source){extra}")
    single = len(one) == 2
    pairs = {}
    for key in ("source", "target"):
        field = key if single else key + "s"
        value = [body[field]] if single else body[field]
        if single and not isinstance(body[field], str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"{field}" must be a string, got {_json_type(body[field])}')
        _check_strings(value, field)
        for i, text in enumerate(value):
            _check_text(text, f'"{field}"' if single else f'"{field}"[{i}]', max_chars)
        pairs[key] = value
    if len(pairs["source"]) != len(pairs["target"]):
        raise RequestError(HTTPStatus.BAD_REQUEST, f'"sources" has {len(pairs["source"])} sentences but "targets" has '
                                                   f'{len(pairs["target"])}; send one target per source')
    if len(pairs["source"]) > max_sentences:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f'"sources" has {len(pairs["source"])} sentences, more '
                                                                f"than this server takes at once ({max_sentences})")
    return pairs["source"], pairs["target"], single


class _Pending:
    """One /translate request waiting in a :class:`RequestBatcher`: its sentences, the characters
    of its longest (``longest``, counted here, on the request's thread), its search (``decode``,
    already checked) and the handler whose client asked; the decoding worker sets ``results``
    (n-best lists, one per sentence) or ``error``, then ``done``."""

    def __init__(self, texts: list[str], decode, key: tuple, handler: "_Handler | None", arrived: float) -> None:
        self.texts, self.decode, self.key, self.handler, self.arrived = texts, decode, key, handler, arrived
        self.longest = max(map(len, texts), default=0)
        self.results: list | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def finish(self, results: list | None = None, error: BaseException | None = None) -> None:
        if not self.done.is_set():  # the first outcome stands (a request failed by stop() is not answered twice)
            self.results, self.error = results, error
            self.done.set()


class RequestBatcher:
    """Dynamic batching: concurrent /translate requests are gathered into one decode call by one
    worker thread, as production NMT servers do. Behind a lock, N clients sending one sentence
    each cost N searches one after another; a search of N sentences costs little more than one.

    A batch opens with the oldest waiting request and takes, in arrival order, the waiting
    requests whose search is the same (``key``: beam, nbest, length penalty...; requests of other
    searches wait for a later batch, never mixed in); it closes when it holds ``max_sentences``
    sentences or, with ``max_chars`` above 0, when its padded size reaches ``max_chars``
    characters: its sentences times the characters of its longest, as the model pads every
    sentence to the longest (the search's memory grows with it: 64 sentences of 10,000 characters
    are no batch of 64 short ones, nor is one long sentence with 63 short ones, which summed
    characters took as small); a request is never split: one larger than either is a batch
    alone), or ``wait`` seconds after its first request arrived, whichever comes first.
    Characters, counted on the request's thread (:class:`_Pending`), stand for source tokens: the
    worker calls no tokenizer to weigh a batch.
    ``wait`` is an upper bound, not a delay: with ``busy`` (whether the model is taken by other
    work, e.g. a /logprob request), a batch is decoded as soon as the worker is free and the model
    is not busy, with what is queued then, and waits for more only while the model is busy
    (``busy`` is asked when a request arrives and when the wait ends). A lone request to an idle
    server was held ``wait`` (5 ms by default) for companions that were not coming; requests that
    arrive while a batch is being decoded still form the next batch, as they queue meanwhile.
    ``busy`` None waits ``wait`` for every batch (a fixed delay: :class:`RequestBatcher` alone
    cannot see the model). A request that arrives while the model is busy therefore waits no
    longer than it did behind the lock. ``decode(batch)``
    answers each request of a batch (:meth:`_Pending.finish`). :meth:`close` stops waiting for
    batches to fill (a stopping server drains what is queued); :meth:`stop` fails what is still
    queued with 503 and refuses new requests, so no client waits for a worker that is gone."""

    def __init__(self, decode, max_sentences: int, wait: float, clock=time.monotonic, max_chars: int = 0,
                 busy: Callable[[], bool] | None = None) -> None:
        self._decode, self.max_sentences, self.wait, self._clock = decode, max_sentences, wait, clock
        self.max_chars = max_chars  # 0: no character budget
        self.busy = busy  # None: every batch waits ``wait`` (or until full)
        self._queue: list[_Pending] = []  # arrival order
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = self._stopped = False

    def queued(self) -> int:
        """How many requests wait for a batch (not those being decoded)."""
        with self._cond:
            return len(self._queue)

    def submit(self, pending: _Pending) -> None:
        with self._cond:
            if self._stopped:
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is stopping and did not decode this "
                                                                   "request; send it again", {"Retry-After": "5"})
            self._queue.append(pending)
            if self._thread is None:  # started with the first request: a server never asked starts no thread
                self._thread = threading.Thread(target=self._run, name="cometnmt-batcher", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def close(self) -> None:
        """Decode what is queued without waiting for batches to fill (the server is stopping)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def stop(self) -> list[_Pending]:
        """Fail the requests still queued (503, send again) and refuse new ones; a batch being
        decoded is answered when it is done (the worker is not interrupted inside the model).
        Returns the requests failed."""
        with self._cond:
            self._closing = self._stopped = True
            left, self._queue = self._queue, []
            self._cond.notify_all()
        for pending in left:
            pending.finish(error=RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the server stopped before this request "
                                                                              "was decoded; send it again",
                                              {"Retry-After": "5"}))
        return left

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._decode(batch)
            except CometNMTError as exc:  # a request decoded alone that the model refused: its own error
                for pending in batch:
                    pending.finish(error=exc)
            except BaseException as exc:  # a bug: every request of the batch gets a 500, the worker lives on
                log.exception("decoding a batch of %d requests failed", len(batch))
                for pending in batch:
                    pending.finish(error=exc)

    def _next_batch(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            if not self._queue:
                return None
            first = self._queue[0]
            while not self._closing and not self._full(*self._fill(first)) and (self.busy is None or self.busy()):
                left = first.arrived + self.wait - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, size, longest, rest = [], 0, 0, []
            for pending in self._queue:
                grown = size + len(pending.texts), max(longest, pending.longest)
                fits = pending is first or not self._over(*grown)
                if pending.key == first.key and fits and not self._full(size, longest):
                    batch.append(pending)
                    size, longest = grown
                else:
                    rest.append(pending)
            self._queue = rest
            return batch

    def _fill(self, first: _Pending) -> tuple[int, int]:
        """The sentences waiting that a batch opened by ``first`` could take, and their longest's characters."""
        same = [p for p in self._queue if p.key == first.key]
        return sum(len(p.texts) for p in same), max(p.longest for p in same)

    def _full(self, sentences: int, longest: int) -> bool:
        """Whether a batch of ``sentences``, the longest of ``longest`` characters, takes no more requests."""
        return sentences >= self.max_sentences or 0 < self.max_chars <= sentences * longest

    def _over(self, sentences: int, longest: int) -> bool:
        """Whether a batch of ``sentences``, the longest of ``longest`` characters, is past a limit."""
        return sentences > self.max_sentences or 0 < self.max_chars < sentences * longest


class TranslationServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` that translates with one :class:`Translator`."""

    daemon_threads = True
    # the listen backlog: socketserver's 5 let a burst of new connections overflow the kernel's accept
    # queue, so 20 clients connecting at once to an idle server got 5 resets and 1 s SYN retries (40: 21
    # resets); 128 is what Python's socket.listen() picks by default
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], translator: Translator | None, checkpoint: str | list[str], *,
                 max_sentences: int = 1000, max_body_bytes: int = 1 << 20, max_beam: int = 64,
                 max_chars: int = 10000, nfc_warning_interval: float = 60.0, max_batch_sentences: int = 64,
                 batch_wait: float = 0.005, max_batch_chars: int = 20000) -> None:
        if ":" in address[0]:  # an IPv6 address such as ::1
            self.address_family = socket.AF_INET6
        # before binding: when the bind fails (port in use, unknown host) socketserver calls
        # server_close(), which needs these, and the caller gets the OSError rather than an AttributeError
        self._handlers: dict[threading.Thread, _Handler | None] = {}  # request threads still running, and their handlers
        self._handlers_lock = threading.Lock()
        self.closing = False  # set by server_close: answers say Connection: close
        # server_close writes a byte here, which stays unread: every handler waiting for a request's
        # head (wait_for_request) then sees the server is closing, at once and whenever it looks
        self._wake = socket.socketpair()
        self.translator, self.checkpoint = translator, checkpoint
        self.max_sentences, self.max_body_bytes, self.max_beam = max_sentences, max_body_bytes, max_beam
        self.max_chars = max_chars
        self.lock = FifoLock()  # the model's, first come first served
        self.nfc_warnings = NfcWarnings(nfc_warning_interval)  # text not in NFC, warned of at most once an interval
        # concurrent /translate requests decoded together, at once when the model is free (its lock neither held
        # nor asked for: the worker holds it only while decoding); None (batch_wait 0 or one sentence a batch):
        # one at a time
        self.batcher = None if batch_wait <= 0 or max_batch_sentences <= 1 else \
            RequestBatcher(self._decode_batch, max_batch_sentences, batch_wait, max_chars=max_batch_chars,
                           busy=lambda: self.lock.waiting() > 0)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        """ThreadingMixIn's, with the thread counted among the running ones before it starts: it
        counted itself once running, so a connection accepted just before a stop, whose thread had
        not yet run, was not waited for by server_close."""
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  daemon=self.daemon_threads)
        with self._handlers_lock:
            self._handlers[thread] = None  # its handler once it has one (_Handler.setup)
        try:
            thread.start()
        except BaseException:  # no thread (out of threads, say): nothing will close the connection
            with self._handlers_lock:
                self._handlers.pop(thread, None)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._handlers_lock:
                self._handlers.pop(threading.current_thread(), None)
                self._close_wake_when_done()

    def _close_wake_when_done(self) -> None:
        """Close the wake socket pair once the server is closed and no handler can look at it any
        more: by server_close, or by the last thread that outlived its wait (the pair was left to
        the garbage collector then, a ResourceWarning). Called with ``_handlers_lock`` held."""
        if self.closing and not self._handlers:
            for end in self._wake:
                end.close()

    def wait_for_request(self, connection: socket.socket, timeout: float) -> bool:
        """Wait until ``connection`` has something to read (bytes, or its end): True. False once
        the server is closing, at once if it is already. TimeoutError after ``timeout`` seconds,
        as the socket's own read would. A handler waits here for the head of its next request."""
        if self.closing:
            return False
        if timeout <= 0:
            raise TimeoutError("timed out")
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(connection, selectors.EVENT_READ)
                selector.register(self._wake[0], selectors.EVENT_READ)
                ready = selector.select(timeout)
        except (OSError, ValueError):  # the wake socket closed under it: the server has closed
            return False
        if self.closing:
            return False
        if not ready:
            raise TimeoutError("timed out")
        return True

    def server_close(self, wait: float = 5.0) -> None:
        """Close the socket, then give the request threads still running up to ``wait`` seconds.
        They are daemons; but one still finishing a response when the interpreter shuts down is
        stopped inside C code, which aborted the process ("terminate called without an active
        exception"; 1 to 4 Ctrl-Cs in 20 right after a request, on a loaded machine; 0 in 30 with
        this wait). A request answered from now on closes its connection, so its thread ends with the
        answer. A connection whose next request has not arrived whole (an idle keep-alive one, or
        one whose client is still sending the request line and headers, slowly or not at all) is
        closed at once, not waited for: its handler, woken from its wait, reads what has arrived by
        then, and stops there unless that is a request's whole head (which is then answered, its
        body still read). A request whose head had arrived before is answered too."""
        with self._handlers_lock:  # the wake byte under the lock: a handler ending now closes the pair
            if not self.closing:
                self.closing = True
                self._wake[1].send(b"\0")
        if self.batcher is not None:  # requests queued are decoded now, without waiting for their batch to fill
            self.batcher.close()
        super().server_close()
        self.nfc_warnings.flush()
        deadline = time.monotonic() + wait
        with self._handlers_lock:
            running = list(self._handlers)
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.batcher is not None:  # those still queued after the wait get 503 (send again), not a wait without end
            # and are given a moment to send it: left to their threads, `cometnmt serve`'s exit (os._exit when
            # requests are still running) raced the answers, and 42 of 60 clients queued got none
            failed = [p.handler for p in self.batcher.stop() if p.handler is not None]
            deadline = time.monotonic() + 1.0
            for handler in failed:
                handler.answered.wait(max(0.0, deadline - time.monotonic()))
        with self._handlers_lock:
            self._close_wake_when_done()  # else the last handler to end closes it

    def register(self, handler: _Handler) -> None:
        """Note the handler of the calling request thread, for :meth:`refuse_running`."""
        with self._handlers_lock:
            if threading.current_thread() in self._handlers:
                self._handlers[threading.current_thread()] = handler

    def still_running(self) -> int:
        """How many request threads are still running (after :meth:`server_close`: those that did
        not finish within its wait)."""
        with self._handlers_lock:
            return sum(thread.is_alive() for thread in self._handlers)

    def refuse_running(self, retry_after: int = 5) -> tuple[int, int]:
        """After :meth:`server_close`, just before the process exits: answer each request still
        being worked on, whose answer has not begun, with 503 Service Unavailable and a Retry-After
        header, so its client knows to send it again (to this server once restarted, or to another
        behind the same proxy) rather than seeing its connection close without an answer. Returns
        (requests refused so, request threads cut off otherwise: an answer half sent, a connection
        waiting for its next request). A thread whose answer was sent, its connection lingering
        (:meth:`_Handler._drain`), is neither: it was counted as cut off "without an answer"."""
        with self._handlers_lock:
            running = [(thread, handler) for thread, handler in self._handlers.items() if thread.is_alive()]
        refused = sum(handler is not None and handler.refuse(retry_after) for _, handler in running)
        answered = sum(handler is not None and handler.answered.is_set() for _, handler in running)
        return refused, len(running) - refused - answered

    def client_gone(self, handler: _Handler | None = None) -> bool:
        """Whether the client of the calling request thread (or of ``handler``) has closed (or reset) its connection: it
        reads as ended, with no pipelined request ahead of the end. A client that gave up while its
        request waited for the model (its timeout, then a retry) still had the request decoded, for
        nobody, delaying the requests behind it; a client that half-closes (shuts down its sending
        side) and still waits for the answer is taken as gone too, as nginx takes it."""
        handler = handler or self._current_handler()
        if handler is None or not _has_bytes(handler.connection):
            return False
        try:
            return handler.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:  # reset
            return True

    def _current_handler(self) -> _Handler | None:
        with self._handlers_lock:
            return self._handlers.get(threading.current_thread())

    def _gone(self, handler: _Handler | None = None) -> None:
        """Called with the model's lock held, before decoding: a client gone by then is not answered."""
        if self.client_gone(handler):
            raise ConnectionAbortedError(_GONE)

    def example(self, route: str) -> str:
        """A JSON body for ``route`` (/translate or /logprob) in the model's languages, for error
        messages: they showed German ({"text": "Ein Hund."}) whatever the model translates from. A
        language without an example sentence gets a neutral one."""
        data = self.translator.cfg.data if self.translator is not None else None
        src = _EXAMPLE_SENTENCES.get(data.src_lang if data else "", "Your sentence.")
        if route == "/logprob":
            tgt = _EXAMPLE_SENTENCES.get(data.tgt_lang if data else "", "Its translation.")
            return json.dumps({"source": src, "target": tgt}, ensure_ascii=False)
        return json.dumps({"text": src}, ensure_ascii=False)

    def health(self) -> dict:
        """The model, its default search and the server's limits. ``batching`` (None when off) names
        the character budget ``max_batch_padded_chars``: it bounds a batch's padded size (sentences x
        the characters of its longest), no longer its summed characters, which ``max_batch_chars``,
        the option's name, read as; that key stays, with the same value, for clients that read it."""
        cfg = self.translator.cfg
        arch = "ensemble" if isinstance(self.checkpoint, list) else cfg.model.arch
        batching = None if self.batcher is None else {
            "max_batch_sentences": self.batcher.max_sentences, "max_batch_padded_chars": self.batcher.max_chars,
            "max_batch_chars": self.batcher.max_chars, "batch_wait_ms": self.batcher.wait * 1000}
        return {"status": "ok", "arch": arch, "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang,
                "checkpoint": self.checkpoint, "decode": to_dict(cfg.decode), "max_sentences": self.max_sentences,
                "max_beam": self.max_beam, "max_chars": self.max_chars, "batching": batching}

    def translate(self, body: object) -> dict:
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body must be a JSON object, got {_json_type(body)}")
        texts, single = _request_texts(body, self.max_sentences, self.max_chars)
        settings = {k: body[k] for k in _SETTINGS if body.get(k) is not None}  # null: the server's default
        for key in ("beam", "nbest"):  # the beam's memory grows with its width: one request must not exhaust it
            value = settings.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > self.max_beam:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"{key}={value}: more than this server's limit of {self.max_beam}")
        self.nfc_warnings.check("/translate", {"texts": texts}, single)
        try:
            if self.batcher is not None:
                results = self._translate_batched(texts, settings)
            else:
                with self.lock, read_from_files():  # the Translator does not warn of text not in NFC: nfc_warnings did
                    self._gone()
                    results = self.translator.translate(texts, **settings)
        except CometNMTError as exc:  # a bad setting or sentence, or one longer than the model's positions
            raise RequestError(HTTPStatus.BAD_REQUEST, _name_field(str(exc), {"input": "texts"}, single)) from None
        # one shape per request option, as translate writes columns for an explicit --nbest 1: a client
        # that sends nbest gets lists whatever its value (an "nbest": 1 got a bare string, "nbest": 2 lists)
        nbest = "nbest" in settings or self.translator.cfg.decode.nbest > 1
        out = [[{"text": h.text, "score": _score(h.score)} for h in hyps] if nbest else hyps[0].text for hyps in results]
        return {"translation": out[0]} if single else {"translations": out}

    def _translate_batched(self, texts: list[str], settings: dict) -> list:
        """``texts`` translated in a batch with other requests of the same search (:class:`RequestBatcher`).
        The search is checked here, so a bad setting fails its request alone, before it is queued;
        sampling requests are decoded alone: a sentence's random stream is keyed by its place in
        the call, so in a batch with others its samples would not be those it gets alone."""
        decode = self.translator.search_config(**settings)
        if not texts:
            return []
        key = (object(),) if decode.method == "sample" else dataclasses.astuple(decode)
        pending = _Pending(texts, decode, key, self._current_handler(), time.monotonic())
        self.batcher.submit(pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.results

    def _decode_batch(self, batch: list[_Pending]) -> None:
        """The batcher's worker: one search over the sentences of ``batch`` (requests of one search),
        each request answered with its own. A sentence the model refuses (longer than its positions)
        fails the whole call, so each request is checked first (:meth:`Translator.check_sources`:
        the request text was checked on arrival, its tokens need the tokenizer, which runs here,
        one thread at a time) and one the model would refuse fails alone, before the search: the
        others were decoded twice, once in the failed call and again alone. The check's tokens are
        those the search takes (:class:`~cometnmt.inference.CheckedSources`): each sentence was
        tokenised twice, by the check and again by the call. Should the call still fail (a refusal
        not foreseen), each request is decoded alone and only its own fails. A request whose client
        has gone is not decoded."""
        with self.lock, read_from_files():  # the Translator does not warn of text not in NFC: nfc_warnings did
            live = []  # (request, its sentences checked and tokenised)
            for pending in batch:
                if self.client_gone(pending.handler):
                    pending.finish(error=ConnectionAbortedError(_GONE))
                    continue
                try:
                    live.append((pending, self.translator.check_sources(pending.texts)))
                except CometNMTError as exc:  # its own refusal, before any search
                    pending.finish(error=exc)
            if not live:
                return
            try:
                results = self.translator.translate(sum((s for _, s in live[1:]), live[0][1]), live[0][0].decode)
            except CometNMTError:
                if len(live) == 1:
                    raise
                for pending, sources in live:  # one request's bad sentence must not fail the others (the fallback)
                    try:
                        pending.finish(self.translator.translate(sources, pending.decode))
                    except CometNMTError as exc:
                        pending.finish(error=exc)
                return
        start = 0
        for pending, _ in live:
            pending.finish(results[start : start + len(pending.texts)])
            start += len(pending.texts)

    def log_prob(self, body: object) -> dict:
        """Forced decoding (:meth:`Translator.log_prob`): each target's log-probability given its source."""
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body must be a JSON object, got {_json_type(body)}")
        sources, targets, single = _request_pairs(body, self.max_sentences, self.max_chars)
        self.nfc_warnings.check("/logprob", {"sources": sources, "targets": targets}, single)
        try:
            with self.lock, read_from_files():  # the Translator does not warn of text not in NFC: nfc_warnings did
                self._gone()
                scores = self.translator.log_prob(sources, targets)
        except CometNMTError as exc:  # a sentence longer than the model's positions, say
            raise RequestError(HTTPStatus.BAD_REQUEST,
                               _name_field(str(exc), {"source": "sources", "target": "targets"}, single)) from None
        out = [{"log_prob": _score(s.log_prob), "tokens": s.tokens, "unknown": s.unknown} for s in scores]
        return out[0] if single else {"scores": out}


def _score(value: float) -> float | None:
    """A score as JSON has it: a number, or null for NaN and infinities (a model whose weights hold
    NaN, from a diverged run, say), which json.dumps wrote as NaN and -Infinity, which no strict
    JSON reader (JavaScript's JSON.parse, Go's encoding/json) takes; the log says so."""
    if math.isfinite(value):
        return value
    log.warning("a score is %s, answered as null: the model's output is not a number (do its weights hold NaN?)", value)
    return None


def _has_bytes(connection: socket.socket) -> bool:
    """Whether a read of ``connection`` returns at once (bytes, or the end of the connection)."""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(connection, selectors.EVENT_READ)
            return bool(selector.select(0))
    except (OSError, ValueError):  # closed: the read says how
        return True


class _Reads(io.RawIOBase):
    """The raw stream under a handler's ``rfile``: its connection's bytes, read by
    :meth:`_Handler.receive_into`."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._handler.receive_into(buffer)


def _significant(length: str) -> str:
    """A Content-Length of digits (and spaces or tabs around them) without its leading zeros."""
    return length.strip(" \t").lstrip("0") or "0"


_ALLOW = {"/health": "GET, HEAD", **{route: "POST" for route in _POST}}  # route -> its methods (Allow header)
# What the header parser notes for a multipart Content-Type alone (curl -F's multipart/form-data; boundary=...):
# it looks for the parts in a body it is not given. The headers themselves are well formed.
_MULTIPART_DEFECTS = (email.errors.StartBoundaryNotFoundDefect, email.errors.CloseBoundaryNotFoundDefect,
                      email.errors.NoBoundaryInMultipartDefect, email.errors.MultipartInvariantViolationDefect)


class _Handler(BaseHTTPRequestHandler):
    """One connection. A request whose body is not read in full (an error before reading it, a
    GET with a body, chunked transfer) closes the connection after its answer, so the rest of the
    body is never taken for the next request; idle connections close after ``timeout`` seconds."""

    server: TranslationServer
    protocol_version = "HTTP/1.1"
    timeout = 60
    _length: int | None = None  # the request's Content-Length, checked by parse_request
    _expect_continue = False  # the request said Expect: 100-continue: _read_body sends 100 Continue
    _in_head = False  # reading (or waiting for) a request line and headers: a stop ends the read
    _cut = False  # the server stopped before this request's head had arrived whole: no answer
    _head_deadline = 0.0  # time.monotonic() by which a request's head must have arrived whole
    _body_read = False  # this request's body has been read in full
    _linger = False  # the connection closes after a refusal or with a body unread: drain it first
    linger_seconds = 5.0  # the longest a closing connection is drained (_drain)
    linger_idle = 1.0  # a client silent this long while draining has stopped sending
    _in_request = False  # a request's head has arrived and its answer is being worked out
    _answering = False  # this request's answer has begun (or the server refused it: _refused)
    _refused = False  # the server, stopping, answered 503 in this handler's place (refuse)
    _blank_line = False  # the line read in place of a request line was empty: the next is read in its place
    answered: threading.Event  # this request's answer has been sent (its connection may still linger: _drain)

    def setup(self) -> None:
        super().setup()
        self._answer_lock = threading.Lock()  # the answer is begun by this thread or by refuse, not both
        self.answered = threading.Event()
        self.server.register(self)
        self.rfile.close()  # the socket's own reader, replaced by one whose reads of a head a stop can end
        self.rfile = io.BufferedReader(_Reads(self))

    def receive_into(self, buffer) -> int:
        """Read the connection into ``buffer``. While the head of a request is awaited, the read
        waits for the bytes or for the server to close: the socket was shut for reading there before,
        which ended a read blocked on it, but Linux still takes the bytes that arrive afterwards, so
        a request arriving then was read up to an arbitrary point (its headers without its body,
        say) and refused with 400. Now a stop ends the head at what has arrived by then. The wait
        and the arrival of a head together have ``timeout`` seconds: a client that sent a byte of
        it now and then (slow-loris) kept its connection and thread as long as it liked, since
        the limit applied to each read alone."""
        if self._in_head and not self.server.wait_for_request(self.connection, self._head_deadline - time.monotonic()):
            if not _has_bytes(self.connection):  # the server is closing and nothing more has come
                self._cut = True
                return 0
        return self.connection.recv_into(buffer)

    def handle_expect_100(self) -> bool:
        """http.server sends 100 Continue from within parse_request, before the checks that can be
        made from the headers alone (length, size, path, method): a client was told to send a body
        that was then refused. Nothing is sent here: parse_request notes the expectation, and
        _read_body sends 100 Continue once the request is sure to be read; a request refused before
        that gets its final status alone (and its connection closed, since the client may send the
        body anyway)."""
        return True

    def handle_one_request(self) -> None:
        self._in_head, self._cut = True, False  # until parse_request has the headers
        self._length, self._body_read, self._linger = None, False, False
        with self._answer_lock:
            self._in_request = self._answering = False
        self.answered.clear()
        if not self._blank_line:  # empty lines before a request line are part of its head's time
            self._head_deadline = time.monotonic() + self.timeout
        self._blank_line = False
        self.requestline = ""  # the last request's, until this one's is read
        try:
            super().handle_one_request()
        except ConnectionError as exc:  # reset or closed by the client, reading its request or writing
            # the answer: nobody to answer. It was a traceback (two when the body was being read: the
            # catch-all for bugs logged one, then its 500 met the closed connection)
            self.close_connection, self._linger = True, False
            self.log_error("connection lost %s: %s", f"during {self.requestline!r}" if self.requestline
                           else "between requests", exc.strerror or exc)
        finally:
            self._in_head = False

    def parse_request(self) -> bool:
        """http.server's parsing, then a 400 (and the connection closed) for a request whose end
        is ambiguous: http.server takes the first of two Content-Length headers, int() reads
        "1_2" or "+12", and a header line such as "Content-Length : 12" silently ends the headers.
        A proxy in front that reads such a request otherwise would pass its rest on as another
        request on the same connection (request smuggling)."""
        self._expect_continue = False
        if not self._cut and self.raw_requestline in (b"\r\n", b"\n"):
            # RFC 9112 2.2: an empty line before a request line is ignored, as a client may send a CRLF after a
            # body, beyond its Content-Length; http.server closed the connection without a word, so the request
            # that followed on it was never answered. The next line is read as this request's line.
            self._blank_line, self.close_connection = True, False
            return False
        if not self._cut and not self.raw_requestline.strip():  # spaces or tabs alone: http.server closed the
            # connection without an answer, as for an empty line
            self.command, self.request_version = None, self.default_request_version  # not the last request's
            line = self.raw_requestline.decode("latin-1").rstrip("\r\n")
            self.send_error(HTTPStatus.BAD_REQUEST, f"bad request line {line!r}: send METHOD PATH HTTP/1.1, e.g. "
                                                    "GET /health HTTP/1.1")
            return False
        if not self._cut and not super().parse_request():
            return False
        if self._cut:  # the server stopped as this request arrived: what did arrive may end anywhere
            # in it, so it is not answered; the client sees the connection close and can retry
            self.close_connection = True
            self.log_message("closed on stopping before the request line and headers had arrived (%r)",
                             self.raw_requestline[:100])
            return False
        self._in_head = False  # the head is here: a stop now lets the request finish, its body included
        with self._answer_lock:
            self._in_request = True
        problem, status = None, HTTPStatus.BAD_REQUEST
        lengths = self.headers.get_all("Content-Length") or []
        # a line that is not "Name: value" ends the headers there; a multipart Content-Type was taken for one
        # ("malformed header line ''", 400), where it is a type this server does not read (415, _read_body)
        if any(not isinstance(defect, _MULTIPART_DEFECTS) for defect in self.headers.defects):
            line = str(self.headers.get_payload()).splitlines()[:1] or [""]
            problem = f"malformed header line {line[0][:100]!r}; send Name: value lines"
        elif len(lengths) > 1:
            problem = f"{len(lengths)} Content-Length headers ({', '.join(map(repr, lengths))}); send one"
        elif lengths and not re.fullmatch(r"[0-9]+", lengths[0].strip(" \t")):
            problem = f"Content-Length {lengths[0]!r} is invalid: send the body's size in bytes, digits only"
        elif lengths and len(digits := _significant(lengths[0])) > 18:  # past any body; past 4300 digits, int()'s
            # limit, it was a ValueError: a traceback in the log, and the connection dropped without an answer
            problem, status = (f"the body's Content-Length has {len(digits)} digits, more than this server takes "
                               f"({self.server.max_body_bytes} bytes)"), HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        if problem:
            self.close_connection = True
            self._send(status, {"error": problem})
            return False
        expect = ", ".join(self.headers.get_all("Expect") or [])
        expectations = {e.strip(" \t").lower() for e in expect.split(",")} - {""}
        if expectations - {"100-continue"}:  # RFC 9110 10.1.1: an expectation the server cannot meet is
            # 417 (http.server ignored it, answering as if the client expected nothing)
            self.close_connection = True  # the client may send the body or not: neither is read
            self._send(HTTPStatus.EXPECTATION_FAILED, {"error": f"Expect {expect!r} cannot be met; this server "
                                                                "knows only Expect: 100-continue"})
            return False
        # 100-continue however written (http.server took only that exact value, case aside, so
        # "100-continue " sent no 100 Continue and its client waited); an HTTP/1.0 request's is
        # ignored (RFC 9110)
        self._expect_continue = bool(expectations) and self.request_version not in ("HTTP/0.9", "HTTP/1.0")
        self._length = int(_significant(lengths[0])) if lengths else None
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (an unknown method 501, a request line too long 414, too many or
        too long header lines 431, a bad request line 400) as JSON like every other error, not an
        HTML page; the connection closes, as http.server's does."""
        self.close_connection = True
        if self._cut:  # refusing a request cut short by a stop (see parse_request): no answer
            return
        self.log_error("code %d, message %s", code, message)
        if self.request_version == "HTTP/0.9" and len(self.requestline.split()) != 2:
            # refused before its version was read (a bad or unsupported version, a line that is not
            # METHOD PATH VERSION): http.server still took it for HTTP/0.9 and sent the body alone,
            # no status line or headers; only a GET PATH line is HTTP/0.9
            self.request_version = "HTTP/1.0"
        phrase = self.responses.get(code, ("error",))[0]
        self._send(HTTPStatus(code), {"error": message or phrase})

    def _send(self, status: HTTPStatus, payload: dict | None, headers: dict[str, str] | None = None) -> None:
        # allow_nan=False: never NaN or Infinity, which is not JSON (a bug that lets one through is a 500);
        # backslashreplace: a lone surrogate (a key "\ud800" an error names) is written as JSON's own escape of it,
        # where encoding it failed, a traceback in the log and the connection dropped without an answer
        data = b"" if payload is None else \
            json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8", "backslashreplace")
        with self._answer_lock:
            if self._refused:  # the stopping server has answered 503 in its place: the connection is over
                self.close_connection, self._linger = True, False
                return
            self._answering = True
        if self.server.closing:  # the server is stopping: no further requests on this connection
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
            # a refusal, or an answer that left the body unread: the client may still be sending
            self._linger = status >= 400 or (self._has_body() and not self._body_read)
        self.end_headers()
        if self.command != "HEAD":  # HEAD: GET's status and headers, Content-Length included, no body
            self.wfile.write(data)
        self.answered.set()

    def _route(self) -> str:
        """The request's path, a query string ignored. http.server reads the request line as Latin-1:
        a path sent in UTF-8 ("/heälth") was named in the 404 as mojibake ("/heÃ¤lth")."""
        return urlsplit(self.path).path.encode("latin-1").decode("utf-8", "backslashreplace")

    def _has_body(self) -> bool:
        return "Transfer-Encoding" in self.headers or bool(self._length)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming); also HEAD
        if self._has_body():
            self.close_connection = True
        if self._route() == "/health":
            self._send(HTTPStatus.OK, self.server.health())
        elif self._route() in _POST:  # an endpoint, with another method
            self._not_allowed()
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint {self._route()}; use GET /health, POST /translate "
                                                       "or POST /logprob"})

    def _read_body(self) -> bytes:
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length header, not chunked")
        length = self._length  # one, and digits only: parse_request answered 400 otherwise
        if length is None:  # curl -X POST without -d, say: said only "send a Content-Length header"
            self.close_connection = True
            fields = _FIELDS[self._route()]
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, f"POST {self._route()} needs a JSON body ({fields}), e.g. "
                                                           f"{self.server.example(self._route())}, sent with a "
                                                           "Content-Length header; this request has neither")
        if length > self.server.max_body_bytes:
            self.close_connection = True
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"the body has {length} bytes, more than this server takes ({self.server.max_body_bytes})")
        coding = ", ".join(self.headers.get_all("Content-Encoding") or [])
        if {c.strip(" \t").lower() for c in coding.split(",")} - {"", "identity"}:  # RFC 9110 8.4, 15.5.16
            # a gzip body was read as it came: "the body is not valid UTF-8 (byte 1)", as if its text were misencoded
            self.close_connection = True
            raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Encoding {coding!r}: this server reads "
                                                                  "bodies as sent; send the JSON uncompressed",
                               {"Accept-Encoding": "identity"})
        try:
            _check_content_type(self.headers.get_all("Content-Type") or [])
        except RequestError:  # before 100 Continue: the body is not wanted, nor read
            self.close_connection = True
            raise
        if self._expect_continue:  # every check the headers allow has passed: the body is wanted
            self._expect_continue = False
            with self._answer_lock:  # not into the middle of a 503 from refuse
                if not self._refused:
                    self.send_response_only(HTTPStatus.CONTINUE)
                    self.end_headers()
        try:
            raw = self.rfile.read(length)
        except TimeoutError:  # a body shorter than its Content-Length, its client waiting for an answer
            self.close_connection = True
            raise RequestError(HTTPStatus.REQUEST_TIMEOUT, f"the body did not arrive within {self.timeout} s: "
                                                           f"send the {length} bytes Content-Length says") from None
        if len(raw) < length:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body ended after {len(raw)} of {length} bytes")
        self._body_read = True
        return raw

    def do_POST(self) -> None:  # noqa: N802
        try:
            if self._route() == "/health":  # an endpoint, with another method
                return self._not_allowed()
            if self._route() not in _POST:
                if self._has_body():
                    self.close_connection = True
                raise RequestError(HTTPStatus.NOT_FOUND,
                                   f"no such endpoint {self._route()}; use POST /translate or POST /logprob")
            raw = self._read_body()
            example = self.server.example(self._route())
            if not raw.strip(b" \t\r\n"):  # was 'not valid JSON: Expecting value: line 1 column 1 (char 0)'
                raise self._not_json(f"the body is empty; send a JSON object, e.g. {example}")
            try:
                # a byte order mark before the JSON (Notepad's UTF-8, curl --data-binary @file of it) is dropped, as
                # RFC 8259 8.1 allows: it was 'not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig)'
                body = json.loads(raw.decode("utf-8").removeprefix("\ufeff"), object_pairs_hook=_unique_keys)
            except UnicodeDecodeError as exc:
                hint = _utf16_hint(raw) + _latin1_hint(raw, exc.start)  # each says what to send; else say it here
                raise self._not_json(f"the body is not valid UTF-8 (byte {exc.start})"
                                     f"{hint or '; send the JSON in UTF-8 (RFC 8259 8.1)'}") from None
            except json.JSONDecodeError as exc:
                hint = _form_hint(raw, example) + _utf16_hint(raw)
                fix = hint or f"; send a JSON object, e.g. {example}"
                raise self._not_json(f"the body is not valid JSON: {exc}{fix}") from None
            except RecursionError:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"the body's JSON is nested too deeply; send a JSON object, "
                                                           f"e.g. {example}") from None
            except ValueError:  # an integer longer than Python reads (sys.get_int_max_str_digits()): not a
                # JSONDecodeError, so it was answered 500 with a traceback in the log
                raise RequestError(HTTPStatus.BAD_REQUEST, "the body's JSON holds an integer of more than "
                                                           f"{sys.get_int_max_str_digits()} digits; send numbers of "
                                                           "fewer digits") from None
            self._send(HTTPStatus.OK, getattr(self.server, _POST[self._route()])(body))
        except RequestError as exc:
            self._send(exc.status, {"error": str(exc)}, exc.headers)
        except ConnectionError:  # the client is gone: handle_one_request says so in one line
            raise
        except Exception:  # a bug must cost one request an answer of 500, not the connection
            log.exception("POST %s failed", self.path)
            self.close_connection = True
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error; see the server's log"})

    def _not_json(self, problem: str) -> RequestError:
        """A body that is no JSON (empty, not UTF-8, not JSON; ``problem`` says which and what to
        send): 400 if its Content-Type said JSON; sent without one (which is read as JSON, as
        http.client and raw sockets send none), 415 saying which type to send: it was a 400 'not
        valid JSON', as if the server read any type and the body were badly written. An empty body
        was a 400 even without the header, the one body that is no JSON answered so."""
        if self.headers.get_all("Content-Type"):
            return RequestError(HTTPStatus.BAD_REQUEST, problem)
        return RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"{problem}; the request has no Content-Type: this "
                                                               "server reads JSON, send it with Content-Type: "
                                                               "application/json", {"Accept-Post": "application/json"})

    def refuse(self, retry_after: int) -> bool:
        """Called by the stopping server from another thread (TranslationServer.refuse_running):
        answer 503 with ``Retry-After`` in this handler's place, if a request is being worked on and
        its answer has not begun; its thread, still computing, then writes nothing. True if sent."""
        with self._answer_lock:
            if not self._in_request or self._answering or self._refused:
                return False
            self._refused = True
            data = json.dumps({"error": "the server is stopping and did not finish this request; "
                                        "send it again"}).encode("utf-8")
            head = (f"{self.protocol_version} 503 Service Unavailable\r\nServer: {self.version_string()}\r\n"
                    f"Date: {self.date_time_string()}\r\nContent-Type: application/json; charset=utf-8\r\n"
                    f"Content-Length: {len(data)}\r\nRetry-After: {retry_after}\r\nConnection: close\r\n\r\n")
            try:
                self.wfile.flush()  # a 100 Continue written before, if any, goes first
                self.connection.settimeout(1.0)  # a client that reads nothing must not hold the exit
                self.connection.sendall(head.encode("latin-1") + data)
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:  # gone, or not reading: the connection closes with the process
                return False
            return True

    def finish(self) -> None:
        super().finish()  # the answer flushed
        if self._linger and not self._cut:
            self._drain()

    def _drain(self) -> None:
        """A lingering close (Apache's and nginx's): a connection closed with bytes of the client's
        still unread or on their way (a refused request's body, a request line or headers cut at a
        limit) made the kernel answer them with a reset, and a client still sending its body (Python's
        http.client, requests, curl) got a broken pipe or a reset instead of the answer, e.g. 413 for
        a body over 1 MiB. So the answer is ended (FIN), then what the client sends is read and
        dropped until it closes, stays silent for ``linger_idle`` seconds, or ``linger_seconds``
        pass; then the connection closes."""
        connection = self.connection
        deadline = time.monotonic() + self.linger_seconds
        try:
            connection.shutdown(socket.SHUT_WR)
            while (left := deadline - time.monotonic()) > 0:
                connection.settimeout(min(left, self.linger_idle))
                if not connection.recv(1 << 16):  # the client closed
                    return
        except OSError:  # silent (a timeout), reset or gone: close now
            return

    def _not_allowed(self) -> None:
        if self._has_body():
            self.close_connection = True
        route = self._route()
        allowed = {"/health": "GET"}.get(route, _ALLOW.get(route, "GET /health or POST /translate or /logprob"))
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{self.command} is not supported; use {allowed}"},
                   {"Allow": _ALLOW[route]} if route in _ALLOW else None)

    do_HEAD = do_GET
    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def log_message(self, format: str, *args) -> None:  # through logging, not straight to stderr
        log.info("%s %s", self.address_string(), format % args)


def make_server(checkpoint: str | list[str], host: str = "127.0.0.1", port: int = 8080, device: str = "auto", *,
                beam: int | None = None, nbest: int | None = None, length_penalty: float | None = None,
                batch_size: int | None = None, max_sentences: int = 1000, max_body_bytes: int = 1 << 20,
                max_beam: int = 64, max_chars: int = 10000, nfc_warning_interval: float = 60.0,
                max_batch_sentences: int = 64, batch_wait_ms: float = 5.0, max_batch_chars: int = 20000,
                flags: bool = False,
                sampling: bool | None = None, topk: int | None = None,
                topp: float | None = None, temperature: float | None = None, seed: int | None = None,
                replace_unk: bool | None = None, precision: str | None = None) -> TranslationServer:
    """Load ``checkpoint`` (a list of several: an ensemble) and bind the server (``port`` 0 picks a
    free port: ``server.server_port``).
    ``beam``, ``nbest``, ``length_penalty``, ``batch_size``, ``replace_unk``, ``precision`` and the sampling settings (those of
    :meth:`Translator.translate`) replace the checkpoint's search settings as the default of every
    request. ``max_sentences``, ``max_chars`` (per sentence), ``max_body_bytes`` and ``max_beam`` (also
    ``nbest``) bound what one request may ask for. ``nfc_warning_interval``: the seconds between two
    warnings of request text not in Unicode NFC (:class:`NfcWarnings`; 0: one per such request).
    ``max_batch_sentences``, ``max_batch_chars`` and ``batch_wait_ms``: dynamic batching
    (:class:`RequestBatcher`), a batch closes at that many sentences, that many padded characters
    (its sentences x the characters of its longest, as the model pads them; 0: no character
    budget) or, while the model is busy, that many milliseconds after its first request (a batch
    that finds the model free is decoded at once; 0, or one sentence: off, each request decoded alone).
    Call ``serve_forever()`` on the result to serve."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{setting('port', port, flags)}: must be a port number, 0 to 65535")
    if not isinstance(host, str) or not host.strip(" \t"):  # "" is every interface to bind(): an unset $HOST
        # in --host "$HOST" exposed the server, which has no authentication, where 127.0.0.1 was meant
        raise ConfigError(f"{setting('host', repr(host), flags)}: give an address to listen on (default 127.0.0.1; "
                          "0.0.0.0 for every interface)")
    for name, value in (("max_sentences", max_sentences), ("max_beam", max_beam), ("max_chars", max_chars)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{setting(name, value, flags)}: must be at least 1")
    interval = nfc_warning_interval
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < math.inf:
        raise ConfigError(f"{setting('nfc_warning_interval', interval, flags)}: must be a number of seconds, 0 or more "
                          "(0: a warning for every request holding text not in Unicode NFC)")
    if isinstance(max_batch_sentences, bool) or not isinstance(max_batch_sentences, int) or max_batch_sentences < 1:
        raise ConfigError(f"{setting('max_batch_sentences', max_batch_sentences, flags)}: must be at least 1 (1: no "
                          "batching of concurrent requests)")
    if isinstance(max_batch_chars, bool) or not isinstance(max_batch_chars, int) or max_batch_chars < 0:
        raise ConfigError(f"{setting('max_batch_chars', max_batch_chars, flags)}: must be a number of characters, 0 or "
                          "more (0: no character budget, batches bounded by their sentences alone)")
    if isinstance(batch_wait_ms, bool) or not isinstance(batch_wait_ms, (int, float)) or not 0 <= batch_wait_ms < math.inf:
        raise ConfigError(f"{setting('batch_wait_ms', batch_wait_ms, flags)}: must be a number of milliseconds, 0 or more "
                          "(0: no batching of concurrent requests)")
    paths = [str(c) for c in checkpoint_list(checkpoint)]
    try:  # bind first: a port in use is reported at once, not after loading the model (connections wait in
        # the listen queue until serve_forever)
        server = TranslationServer((host, port), None, paths[0] if len(paths) == 1 else paths, max_sentences=max_sentences,
                                   max_body_bytes=max_body_bytes, max_beam=max_beam, max_chars=max_chars,
                                   nfc_warning_interval=nfc_warning_interval, max_batch_sentences=max_batch_sentences,
                                   batch_wait=batch_wait_ms / 1000, max_batch_chars=max_batch_chars)
    except OSError as exc:
        raise CometNMTError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        translator = Translator.from_checkpoint(checkpoint, device)
        translator.cfg.decode = translator.search_config(beam=beam, nbest=nbest, length_penalty=length_penalty,
                                                         batch_size=batch_size, sampling=sampling, topk=topk, topp=topp,
                                                         temperature=temperature, seed=seed, replace_unk=replace_unk,
                                                         precision=precision, flags=flags)
    except BaseException:
        server.server_close()
        raise
    server.translator = translator
    return server
