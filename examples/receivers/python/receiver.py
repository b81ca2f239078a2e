#!/usr/bin/env python3
"""Example txhook webhook receiver, Python standard library only.

Verifies either the Standard Webhooks scheme (webhook-id, webhook-timestamp,
webhook-signature) or the Stripe-style scheme (one "t=<unix>,v1=<hex>"
header) over the raw request body, then deduplicates by event id in memory.

    TXHOOK_SECRETS=whsec_... python3 receiver.py --port 8000

See ../README.md for every option. Responses:

    200 "processed <id>"    first receipt, handled
    200 "duplicate <id>"    already handled, not handled again
    409 "in progress <id>"  the same event is being handled right now; retry
    400 malformed request   401 bad or missing signature, stale timestamp
    411 no Content-Length   413 body over 1 MiB
"""

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20  # bytes
MAX_ENTRIES = 32  # signature entries read from one header
MAX_UNIX = 253402300799  # 9999-12-31T23:59:59Z
DEDUP_CAPACITY = 100_000  # event ids remembered

DEFAULT_PORT = 8000
DEFAULT_TOLERANCE = 300  # seconds, in either direction
DEFAULT_STRIPE_HEADER = "X-Webhook-Signature"

# Only canonical decimal: the signed string must have a single spelling.
CANONICAL_UINT = re.compile(r"0|[1-9][0-9]{0,18}", re.ASCII)
HEX64 = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)
# Printable ASCII without space or '.', as the Standard Webhooks spec asks.
MESSAGE_ID = re.compile(r"[!-\-/-~]+", re.ASCII)
# An event id from a Stripe-style body: printable ASCII, no spaces.
EVENT_ID = re.compile(r"[!-~]{1,255}", re.ASCII)


class Reject(Exception):
    """A request we refuse: status code and a short reason (never a secret)."""

    def __init__(self, status, reason, close=False):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.close = close


# ---------------------------------------------------------------- secrets


def load_keys(scheme, raw):
    """Turn the comma-separated secrets into HMAC keys. Errors name a secret
    by position, never by content."""
    secrets = [s.strip() for s in raw.split(",") if s.strip()]
    if not secrets:
        raise ValueError("no secrets: set TXHOOK_SECRETS (comma-separated)")
    keys = []
    for i, s in enumerate(secrets):
        if s.startswith(("whsk_", "whpk_")):
            raise ValueError(f"secrets[{i}]: ed25519 keys (v1a) are not supported by this example")
        if scheme == "standard":
            # "whsec_" + base64; the bare base64 part is accepted too.
            enc = s[len("whsec_"):] if s.startswith("whsec_") else s
            try:
                key = base64.b64decode(enc, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"secrets[{i}]: not base64 after whsec_") from None
            if not 24 <= len(key) <= 64:
                raise ValueError(f"secrets[{i}]: decodes to {len(key)} bytes, want 24 to 64")
        else:
            # Stripe style: the secret string's bytes, as given.
            key = s.encode("utf-8")
            if len(key) < 16:
                raise ValueError(f"secrets[{i}]: shorter than 16 bytes")
        keys.append(key)
    return keys


# ----------------------------------------------------------- verification


def single_header(headers, name):
    values = headers.get_all(name) or []
    if len(values) > 1:
        # Two ids or timestamps: no telling which one the sender signed.
        raise Reject(400, f"header {name} appears more than once")
    value = values[0].strip(" \t") if values else ""
    if not value:
        raise Reject(401, f"missing header {name}")
    return value


def check_timestamp(ts, tolerance):
    if not CANONICAL_UINT.fullmatch(ts):
        raise Reject(400, "malformed timestamp")
    sec = int(ts)
    now = time.time()
    if sec > MAX_UNIX or sec - now > tolerance:
        raise Reject(401, "timestamp too new")
    if now - sec > tolerance:
        raise Reject(401, "timestamp too old")


def verify_standard(headers, body, keys, tolerance):
    """Returns the verified webhook-id."""
    msg_id = single_header(headers, "webhook-id")
    ts = single_header(headers, "webhook-timestamp")
    sig_header = single_header(headers, "webhook-signature")
    if not MESSAGE_ID.fullmatch(msg_id):
        raise Reject(400, "malformed webhook-id")
    candidates, shaped = [], 0
    for entry in [e for e in sig_header.split(" ") if e][:MAX_ENTRIES]:
        version, sep, sig = entry.partition(",")
        if not sep or not version or not sig:
            continue
        shaped += 1
        if version == "v1":  # others (v1a, future versions) are skipped
            candidates.append(sig.encode("latin-1"))
    if shaped == 0:
        raise Reject(400, "malformed webhook-signature")
    check_timestamp(ts, tolerance)

    signed = f"{msg_id}.{ts}.".encode("ascii") + body
    for key in keys:
        # Comparing base64 text is comparing the bytes: the standard
        # encoding of 32 bytes has exactly one spelling.
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
        for sig in candidates:
            if hmac.compare_digest(expected, sig):
                return msg_id
    raise Reject(401, "no matching signature")


def verify_stripe(headers, body, keys, tolerance, header):
    value = single_header(headers, header)
    ts, sigs, seen = None, [], 0
    for element in value.split(","):
        element = element.strip(" \t")
        if not element:
            continue
        seen += 1
        if seen > MAX_ENTRIES:
            break
        k, sep, v = element.partition("=")
        if not sep:
            continue
        if k == "t":
            if ts is not None:
                raise Reject(400, "more than one t= in signature header")
            ts = v
        elif k == "v1" and HEX64.fullmatch(v):
            sigs.append(bytes.fromhex(v))
        # unknown keys are ignored
    if not ts:
        raise Reject(400, "malformed signature header: no t=")
    check_timestamp(ts, tolerance)
    if not sigs:
        raise Reject(401, "no v1 signature")

    signed = ts.encode("ascii") + b"." + body
    for key in keys:
        expected = hmac.new(key, signed, hashlib.sha256).digest()
        for sig in sigs:
            if hmac.compare_digest(expected, sig):
                return
    raise Reject(401, "no matching signature")


def reject_constant(name):
    # json.loads takes NaN and Infinity, which are not JSON.
    raise ValueError(f"{name} is not JSON")


# ------------------------------------------------------------------ dedup

NEW, PROCESSING, DONE = "new", "processing", "done"


class Dedup:
    """Event ids seen, in memory: lost on restart, bounded to `capacity`
    (oldest forgotten first). A production receiver uses a unique constraint
    in its database or Redis SET NX instead."""

    def __init__(self, capacity=DEDUP_CAPACITY):
        self._lock = threading.Lock()
        self._state = OrderedDict()
        self._capacity = capacity

    def claim(self, event_id):
        """NEW if the caller now owns event_id, else its current state."""
        with self._lock:
            state = self._state.get(event_id)
            if state is not None:
                return state
            self._state[event_id] = PROCESSING
            while len(self._state) > self._capacity:
                self._state.popitem(last=False)
            return NEW

    def done(self, event_id):
        with self._lock:
            self._state[event_id] = DONE

    def release(self, event_id):
        """Forget a failed attempt so the sender's retry is processed."""
        with self._lock:
            self._state.pop(event_id, None)


def process(event_id, event):
    """The business logic. Event types we do not handle still get 200."""
    print(f"processed event {event_id} type={event.get('type')!r}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "txhook-example-receiver"
    # Headers and body go out in two writes; with Nagle's algorithm on, the
    # second waits for the client's delayed ACK (40 ms on Linux).
    disable_nagle_algorithm = True

    def do_POST(self):
        try:
            status, text = self.handle_webhook()
            close = False
        except Reject as r:
            status, text, close = r.status, r.reason, r.close
        except Exception as e:  # a failed handler: the sender retries
            print(f"receiver: handler failed: {type(e).__name__}", file=sys.stderr, flush=True)
            status, text, close = 500, "internal error", True
        self.reply(status, text, close)

    def method_not_allowed(self):
        self.reply(405, "method not allowed, use POST", close=True, extra={"Allow": "POST"})

    do_GET = do_HEAD = do_PUT = do_PATCH = do_DELETE = method_not_allowed

    def read_body(self):
        if self.headers.get("Transfer-Encoding"):
            raise Reject(411, "send a Content-Length, not Transfer-Encoding", close=True)
        length = self.headers.get_all("Content-Length") or []
        if not length:
            raise Reject(411, "Content-Length required", close=True)
        if len(length) > 1 or not CANONICAL_UINT.fullmatch(length[0].strip()):
            raise Reject(400, "malformed Content-Length", close=True)
        n = int(length[0])
        if n > MAX_BODY:
            raise Reject(413, f"body over {MAX_BODY} bytes", close=True)
        body = self.rfile.read(n)
        if len(body) != n:
            raise Reject(400, "body shorter than Content-Length", close=True)
        return body

    def handle_webhook(self):
        cfg = self.server.cfg
        body = self.read_body()

        # 1. Verify the raw bytes, before any parsing.
        if cfg.scheme == "standard":
            event_id = verify_standard(self.headers, body, cfg.keys, cfg.tolerance)
        else:
            verify_stripe(self.headers, body, cfg.keys, cfg.tolerance, cfg.header)
            event_id = None

        # 2. Parse what the signature vouches for.
        try:
            # Decoding first refuses a BOM and UTF-16/32, which json.loads
            # would guess from bytes.
            event = json.loads(body.decode("utf-8"), parse_constant=reject_constant)
        except (ValueError, RecursionError):
            raise Reject(400, "body is not JSON") from None
        if not isinstance(event, dict):
            raise Reject(400, "body is not a JSON object")
        if event_id is None:
            # Stripe style: the webhook-id header is not signed, so the id
            # comes from the signed body.
            event_id = event.get("id")
            if not isinstance(event_id, str) or not EVENT_ID.fullmatch(event_id):
                raise Reject(400, "body has no usable id (1 to 255 printable ASCII characters)")

        # 3. Deduplicate before processing.
        state = cfg.dedup.claim(event_id)
        if state == DONE:
            return 200, f"duplicate {event_id}"
        if state == PROCESSING:
            return 409, f"in progress {event_id}"
        try:
            process(event_id, event)
        except Exception:
            cfg.dedup.release(event_id)
            raise
        cfg.dedup.done(event_id)
        return 200, f"processed {event_id}"

    def reply(self, status, text, close=False, extra=None):
        body = (text + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if close:
            # The body may be unread: this connection cannot be reused.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # listen backlog; socketserver's default is 5


class Config:
    pass


def parse_config(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(
        description="txhook example webhook receiver. Secrets come from TXHOOK_SECRETS only "
        "(comma-separated), so they never show in the process list."
    )
    p.add_argument("--host", default=env("TXHOOK_HOST", "127.0.0.1"))
    p.add_argument("--port", default=env("TXHOOK_PORT", str(DEFAULT_PORT)), help="0 picks a free port")
    p.add_argument("--scheme", default=env("TXHOOK_SCHEME", "standard"), help="standard | stripe")
    p.add_argument("--header", default=env("TXHOOK_HEADER", DEFAULT_STRIPE_HEADER),
                   help="signature header of the stripe scheme")
    p.add_argument("--tolerance", default=env("TXHOOK_TOLERANCE", str(DEFAULT_TOLERANCE)),
                   help="seconds a timestamp may be off, either direction")
    a = p.parse_args(argv)

    cfg = Config()
    cfg.host = a.host
    try:
        cfg.port = int(a.port)
        cfg.tolerance = int(a.tolerance)
    except ValueError:
        raise ValueError("port and tolerance must be integers") from None
    if not 0 <= cfg.port <= 65535:
        raise ValueError("port must be 0 to 65535")
    if cfg.tolerance <= 0:
        raise ValueError("tolerance must be a positive number of seconds")
    cfg.scheme = a.scheme
    if cfg.scheme not in ("standard", "stripe"):
        raise ValueError("scheme must be standard or stripe")
    cfg.header = a.header.strip()
    if not cfg.header:
        raise ValueError("header must not be empty")
    cfg.keys = load_keys(cfg.scheme, env("TXHOOK_SECRETS", ""))
    cfg.dedup = Dedup()
    return cfg


def main(argv):
    try:
        cfg = parse_config(argv)
    except ValueError as e:
        print(f"receiver: {e}", file=sys.stderr)
        return 2
    server = Server((cfg.host, cfg.port), Handler)
    server.cfg = cfg
    # The first line of stdout says where we listen (port 0 picks one).
    print(f"LISTENING {server.server_address[1]}", flush=True)
    print(f"receiver: {cfg.scheme} scheme, {len(cfg.keys)} secret(s), tolerance {cfg.tolerance}s",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
