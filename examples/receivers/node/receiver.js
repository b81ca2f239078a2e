#!/usr/bin/env node
// Example txhook webhook receiver: Node.js built-ins only (node:http,
// node:crypto), no npm packages. Node.js 16 or later.
//
// Verifies either the Standard Webhooks scheme (webhook-id,
// webhook-timestamp, webhook-signature) or the Stripe-style scheme (one
// "t=<unix>,v1=<hex>" header) over the raw request body, then deduplicates
// by event id in memory.
//
//     TXHOOK_SECRETS=whsec_... node receiver.js --port 8000
//
// See ../README.md for every option. Responses:
//
//     200 "processed <id>"    first receipt, handled
//     200 "duplicate <id>"    already handled, not handled again
//     409 "in progress <id>"  the same event is being handled right now; retry
//     400 malformed request   401 bad or missing signature, stale timestamp
//     413 body over 1 MiB
'use strict';

const http = require('node:http');
const crypto = require('node:crypto');

const MAX_BODY = 1 << 20; // bytes
const MAX_ENTRIES = 32; // signature entries read from one header
const MAX_UNIX = 253402300799; // 9999-12-31T23:59:59Z
const DEDUP_CAPACITY = 100000; // event ids remembered

const DEFAULT_PORT = 8000;
const DEFAULT_TOLERANCE = 300; // seconds, in either direction
const DEFAULT_STRIPE_HEADER = 'X-Webhook-Signature';

// Only canonical decimal: the signed string must have a single spelling.
// (Past 15 digits a JavaScript number is inexact, but such values are far
// beyond MAX_UNIX either way, and the signed text is the string.)
const CANONICAL_UINT = /^(0|[1-9][0-9]{0,18})$/;
const HEX64 = /^[0-9a-fA-F]{64}$/;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
// Printable ASCII without space or '.', as the Standard Webhooks spec asks.
const MESSAGE_ID = /^[\x21-\x2d\x2f-\x7e]+$/;
// An event id from a Stripe-style body: printable ASCII, no spaces.
const EVENT_ID = /^[\x21-\x7e]{1,255}$/;

/** A request we refuse: status code and a short reason (never a secret). */
class Reject extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

// ---------------------------------------------------------------- secrets

/** Turns the comma-separated secrets into HMAC keys. Errors name a secret
 * by position, never by content. */
function loadKeys(scheme, raw) {
  const secrets = raw.split(',').map((s) => s.trim()).filter((s) => s !== '');
  if (secrets.length === 0) throw new Error('no secrets: set TXHOOK_SECRETS (comma-separated)');
  return secrets.map((s, i) => {
    if (s.startsWith('whsk_') || s.startsWith('whpk_')) {
      throw new Error(`secrets[${i}]: ed25519 keys (v1a) are not supported by this example`);
    }
    if (scheme === 'standard') {
      // "whsec_" + base64; the bare base64 part is accepted too.
      const enc = s.startsWith('whsec_') ? s.slice('whsec_'.length) : s;
      if (!BASE64.test(enc)) throw new Error(`secrets[${i}]: not base64 after whsec_`);
      const key = Buffer.from(enc, 'base64');
      if (key.length < 24 || key.length > 64) {
        throw new Error(`secrets[${i}]: decodes to ${key.length} bytes, want 24 to 64`);
      }
      return key;
    }
    // Stripe style: the secret string's bytes, as given.
    const key = Buffer.from(s, 'utf8');
    if (key.length < 16) throw new Error(`secrets[${i}]: shorter than 16 bytes`);
    return key;
  });
}

// ----------------------------------------------------------- verification

function singleHeader(req, name) {
  // rawHeaders keeps repeated headers apart; req.headers would join them.
  const lower = name.toLowerCase();
  const values = [];
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) {
    if (req.rawHeaders[i].toLowerCase() === lower) values.push(req.rawHeaders[i + 1]);
  }
  if (values.length > 1) {
    // Two ids or timestamps: no telling which one the sender signed.
    throw new Reject(400, `header ${name} appears more than once`);
  }
  const value = values.length ? values[0].replace(/^[ \t]+|[ \t]+$/g, '') : '';
  if (value === '') throw new Reject(401, `missing header ${name}`);
  return value;
}

function checkTimestamp(ts, tolerance) {
  if (!CANONICAL_UINT.test(ts)) throw new Reject(400, 'malformed timestamp');
  const sec = Number(ts);
  const now = Date.now() / 1000;
  if (sec > MAX_UNIX || sec - now > tolerance) throw new Reject(401, 'timestamp too new');
  if (now - sec > tolerance) throw new Reject(401, 'timestamp too old');
}

function hmac(key, prefix, body) {
  return crypto.createHmac('sha256', key).update(prefix, 'latin1').update(body).digest();
}

/** Constant time for equal lengths; timingSafeEqual throws on unequal ones. */
function safeEqual(a, b) {
  return a.length === b.length && crypto.timingSafeEqual(a, b);
}

/** Returns the verified webhook-id. */
function verifyStandard(req, body, keys, tolerance) {
  const id = singleHeader(req, 'webhook-id');
  const ts = singleHeader(req, 'webhook-timestamp');
  const sigHeader = singleHeader(req, 'webhook-signature');
  if (!MESSAGE_ID.test(id)) throw new Reject(400, 'malformed webhook-id');
  const candidates = [];
  let shaped = 0;
  for (const entry of sigHeader.split(' ').filter((e) => e !== '').slice(0, MAX_ENTRIES)) {
    const comma = entry.indexOf(',');
    if (comma <= 0 || comma === entry.length - 1) continue;
    shaped++;
    // Other versions (v1a, future ones) are skipped.
    if (entry.slice(0, comma) === 'v1') candidates.push(Buffer.from(entry.slice(comma + 1), 'latin1'));
  }
  if (shaped === 0) throw new Reject(400, 'malformed webhook-signature');
  checkTimestamp(ts, tolerance);

  const prefix = `${id}.${ts}.`;
  for (const key of keys) {
    // Comparing base64 text is comparing the bytes: the standard encoding
    // of 32 bytes has exactly one spelling.
    const expected = Buffer.from(hmac(key, prefix, body).toString('base64'), 'latin1');
    if (candidates.some((sig) => safeEqual(expected, sig))) return id;
  }
  throw new Reject(401, 'no matching signature');
}

function verifyStripe(req, body, keys, tolerance, header) {
  const value = singleHeader(req, header);
  let ts = null;
  let seen = 0;
  const sigs = [];
  for (let element of value.split(',')) {
    element = element.replace(/^[ \t]+|[ \t]+$/g, '');
    if (element === '') continue;
    if (++seen > MAX_ENTRIES) break;
    const eq = element.indexOf('=');
    if (eq < 0) continue;
    const k = element.slice(0, eq);
    const v = element.slice(eq + 1);
    if (k === 't') {
      if (ts !== null) throw new Reject(400, 'more than one t= in signature header');
      ts = v;
    } else if (k === 'v1' && HEX64.test(v)) {
      sigs.push(Buffer.from(v, 'hex'));
    } // unknown keys are ignored
  }
  if (!ts) throw new Reject(400, 'malformed signature header: no t=');
  checkTimestamp(ts, tolerance);
  if (sigs.length === 0) throw new Reject(401, 'no v1 signature');

  const prefix = `${ts}.`;
  for (const key of keys) {
    const expected = hmac(key, prefix, body);
    if (sigs.some((sig) => safeEqual(expected, sig))) return;
  }
  throw new Reject(401, 'no matching signature');
}

// ------------------------------------------------------------------ dedup

const NEW = 'new';
const PROCESSING = 'processing';
const DONE = 'done';

/** Event ids seen, in memory: lost on restart, bounded to `capacity`
 * (oldest forgotten first). A production receiver uses a unique constraint
 * in its database or Redis SET NX instead. */
class Dedup {
  constructor(capacity = DEDUP_CAPACITY) {
    this.state = new Map(); // insertion order = age
    this.capacity = capacity;
  }

  /** NEW if the caller now owns id, else its current state. */
  claim(id) {
    const state = this.state.get(id);
    if (state !== undefined) return state;
    this.state.set(id, PROCESSING);
    while (this.state.size > this.capacity) this.state.delete(this.state.keys().next().value);
    return NEW;
  }

  done(id) {
    this.state.set(id, DONE);
  }

  /** Forgets a failed attempt so the sender's retry is processed. */
  release(id) {
    this.state.delete(id);
  }
}

/** The business logic. Event types we do not handle still get 200. It may
 * be async: the "processing" state keeps a retry that arrives meanwhile
 * from running it twice. */
async function processEvent(id, event) {
  process.stderr.write(`processed event ${id} type=${JSON.stringify(event.type)}\n`);
}

// ------------------------------------------------------------------- HTTP

function readBody(req) {
  return new Promise((resolve, reject) => {
    const declared = req.headers['content-length'];
    if (declared !== undefined && Number(declared) > MAX_BODY) {
      reject(new Reject(413, `body over ${MAX_BODY} bytes`));
      return;
    }
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) {
        req.removeAllListeners('data');
        reject(new Reject(413, `body over ${MAX_BODY} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks, size)));
    req.on('error', reject);
    req.on('close', () => reject(new Reject(400, 'request aborted'))); // no-op once resolved
  });
}

async function handleWebhook(cfg, req) {
  const body = await readBody(req);

  // 1. Verify the raw bytes, before any parsing.
  let id = null;
  if (cfg.scheme === 'standard') {
    id = verifyStandard(req, body, cfg.keys, cfg.tolerance);
  } else {
    verifyStripe(req, body, cfg.keys, cfg.tolerance, cfg.header);
  }

  // 2. Parse what the signature vouches for.
  let event;
  try {
    // fatal: invalid UTF-8 is an error; ignoreBOM: keep a BOM, which JSON.parse refuses.
    event = JSON.parse(new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(body));
  } catch {
    throw new Reject(400, 'body is not JSON');
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw new Reject(400, 'body is not a JSON object');
  }
  if (id === null) {
    // Stripe style: the webhook-id header is not signed, so the id comes
    // from the signed body.
    id = event.id;
    if (typeof id !== 'string' || !EVENT_ID.test(id)) {
      throw new Reject(400, 'body has no usable id (1 to 255 printable ASCII characters)');
    }
  }

  // 3. Deduplicate before processing.
  const state = cfg.dedup.claim(id);
  if (state === DONE) return [200, `duplicate ${id}`];
  if (state === PROCESSING) return [409, `in progress ${id}`];
  try {
    await processEvent(id, event);
  } catch (err) {
    cfg.dedup.release(id);
    throw err;
  }
  cfg.dedup.done(id);
  return [200, `processed ${id}`];
}

function reply(req, res, status, text, extra = {}) {
  const body = Buffer.from(text + '\n', 'utf8');
  const headers = {
    'Content-Type': 'text/plain; charset=utf-8',
    'X-Content-Type-Options': 'nosniff',
    'Content-Length': body.length,
    ...extra,
  };
  if (!req.complete) headers.Connection = 'close'; // body left unread
  res.writeHead(status, headers);
  res.end(req.method === 'HEAD' ? undefined : body);
}

function parseConfig(argv, env) {
  const opts = {
    host: env.TXHOOK_HOST || '127.0.0.1',
    port: env.TXHOOK_PORT || String(DEFAULT_PORT),
    scheme: env.TXHOOK_SCHEME || 'standard',
    header: env.TXHOOK_HEADER || DEFAULT_STRIPE_HEADER,
    tolerance: env.TXHOOK_TOLERANCE || String(DEFAULT_TOLERANCE),
  };
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i];
    let value;
    if (arg === '-h' || arg === '--help') {
      process.stdout.write(
        'usage: node receiver.js [--host H] [--port N] [--scheme standard|stripe] [--header NAME] [--tolerance SECONDS]\n' +
          'Secrets come from TXHOOK_SECRETS only (comma-separated), so they never show in the process list.\n',
      );
      process.exit(0);
    }
    const eq = arg.indexOf('=');
    if (eq > 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    } else {
      value = argv[++i];
    }
    const name = arg.replace(/^--/, '');
    if (!arg.startsWith('--') || !(name in opts)) throw new Error(`unknown option ${arg}`);
    if (value === undefined) throw new Error(`${arg} needs a value`);
    opts[name] = value;
  }

  if (!/^[0-9]+$/.test(opts.port) || Number(opts.port) > 65535) throw new Error('port must be 0 to 65535');
  if (!/^[0-9]+$/.test(opts.tolerance) || Number(opts.tolerance) <= 0) {
    throw new Error('tolerance must be a positive number of seconds');
  }
  if (opts.scheme !== 'standard' && opts.scheme !== 'stripe') throw new Error('scheme must be standard or stripe');
  opts.header = opts.header.trim();
  if (opts.header === '') throw new Error('header must not be empty');
  return {
    host: opts.host,
    port: Number(opts.port),
    scheme: opts.scheme,
    header: opts.header,
    tolerance: Number(opts.tolerance),
    keys: loadKeys(opts.scheme, env.TXHOOK_SECRETS || ''),
    dedup: new Dedup(),
  };
}

function main() {
  let cfg;
  try {
    cfg = parseConfig(process.argv.slice(2), process.env);
  } catch (err) {
    process.stderr.write(`receiver: ${err.message}\n`);
    process.exit(2);
  }

  const server = http.createServer((req, res) => {
    if (req.method !== 'POST') {
      reply(req, res, 405, 'method not allowed, use POST', { Allow: 'POST' });
      return;
    }
    handleWebhook(cfg, req).then(
      ([status, text]) => reply(req, res, status, text),
      (err) => {
        if (err instanceof Reject) {
          reply(req, res, err.status, err.message);
        } else {
          // A failed handler: the sender retries.
          process.stderr.write(`receiver: handler failed: ${err && err.name}\n`);
          reply(req, res, 500, 'internal error');
        }
      },
    );
  });
  server.on('error', (err) => {
    process.stderr.write(`receiver: ${err.message}\n`);
    process.exit(1);
  });
  server.listen(cfg.port, cfg.host, () => {
    // The first line of stdout says where we listen (port 0 picks one).
    process.stdout.write(`LISTENING ${server.address().port}\n`);
    process.stderr.write(
      `receiver: ${cfg.scheme} scheme, ${cfg.keys.length} secret(s), tolerance ${cfg.tolerance}s\n`,
    );
  });
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => server.close(() => process.exit(0)));
}

main();
