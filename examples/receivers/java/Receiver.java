// Example txhook webhook receiver: JDK only (com.sun.net.httpserver,
// javax.crypto), one source file, Java 11 or later, no build tool:
//
//     TXHOOK_SECRETS=whsec_... java Receiver.java --port 8000
//
// Verifies either the Standard Webhooks scheme (webhook-id,
// webhook-timestamp, webhook-signature) or the Stripe-style scheme (one
// "t=<unix>,v1=<hex>" header) over the raw request body, then deduplicates
// by event id in memory.
//
// See ../README.md for every option. Responses:
//
//     200 "processed <id>"    first receipt, handled
//     200 "duplicate <id>"    already handled, not handled again
//     409 "in progress <id>"  the same event is being handled right now; retry
//     400 malformed request   401 bad or missing signature, stale timestamp
//     413 body over 1 MiB

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.regex.Pattern;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

public class Receiver {
    static final int MAX_BODY = 1 << 20; // bytes
    static final int MAX_ENTRIES = 32; // signature entries read from one header
    static final long MAX_UNIX = 253402300799L; // 9999-12-31T23:59:59Z
    static final int DEDUP_CAPACITY = 100_000; // event ids remembered

    static final int DEFAULT_PORT = 8000;
    static final long DEFAULT_TOLERANCE = 300; // seconds, in either direction
    static final String DEFAULT_STRIPE_HEADER = "X-Webhook-Signature";

    // Only canonical decimal: the signed string must have a single spelling.
    static final Pattern CANONICAL_UINT = Pattern.compile("0|[1-9][0-9]{0,18}");
    static final Pattern HEX64 = Pattern.compile("[0-9a-fA-F]{64}");
    // Printable ASCII without space or '.', as the Standard Webhooks spec asks.
    static final Pattern MESSAGE_ID = Pattern.compile("[\\x21-\\x2d\\x2f-\\x7e]+");
    // An event id from a Stripe-style body: printable ASCII, no spaces.
    static final Pattern EVENT_ID = Pattern.compile("[\\x21-\\x7e]{1,255}");

    /** A request we refuse: status code and a short reason (never a secret). */
    static final class Reject extends Exception {
        private static final long serialVersionUID = 1L;
        final int status;

        Reject(int status, String reason) {
            super(reason, null, false, false);
            this.status = status;
        }
    }

    // ------------------------------------------------------------ config

    static final class Config {
        String host = "127.0.0.1";
        int port = DEFAULT_PORT;
        String scheme = "standard";
        String header = DEFAULT_STRIPE_HEADER;
        long tolerance = DEFAULT_TOLERANCE;
        List<byte[]> keys;

        static Config parse(String[] args, Map<String, String> env) {
            Map<String, String> opts = new HashMap<>();
            opts.put("host", env.getOrDefault("TXHOOK_HOST", "127.0.0.1"));
            opts.put("port", env.getOrDefault("TXHOOK_PORT", String.valueOf(DEFAULT_PORT)));
            opts.put("scheme", env.getOrDefault("TXHOOK_SCHEME", "standard"));
            opts.put("header", env.getOrDefault("TXHOOK_HEADER", DEFAULT_STRIPE_HEADER));
            opts.put("tolerance", env.getOrDefault("TXHOOK_TOLERANCE", String.valueOf(DEFAULT_TOLERANCE)));
            for (int i = 0; i < args.length; i++) {
                String arg = args[i];
                if (arg.equals("-h") || arg.equals("--help")) {
                    System.out.println("usage: java Receiver.java [--host H] [--port N] [--scheme standard|stripe]"
                            + " [--header NAME] [--tolerance SECONDS]\n"
                            + "Secrets come from TXHOOK_SECRETS only (comma-separated), so they never show in the"
                            + " process list.");
                    System.exit(0);
                }
                String value;
                int eq = arg.indexOf('=');
                if (eq > 0) {
                    value = arg.substring(eq + 1);
                    arg = arg.substring(0, eq);
                } else {
                    value = i + 1 < args.length ? args[++i] : null;
                }
                String name = arg.startsWith("--") ? arg.substring(2) : "";
                if (!opts.containsKey(name)) throw new IllegalArgumentException("unknown option " + arg);
                if (value == null) throw new IllegalArgumentException(arg + " needs a value");
                opts.put(name, value);
            }

            Config c = new Config();
            c.host = opts.get("host");
            try {
                c.port = Integer.parseInt(opts.get("port"));
                c.tolerance = Long.parseLong(opts.get("tolerance"));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("port and tolerance must be integers");
            }
            if (c.port < 0 || c.port > 65535) throw new IllegalArgumentException("port must be 0 to 65535");
            if (c.tolerance <= 0) throw new IllegalArgumentException("tolerance must be a positive number of seconds");
            c.scheme = opts.get("scheme");
            if (!c.scheme.equals("standard") && !c.scheme.equals("stripe")) {
                throw new IllegalArgumentException("scheme must be standard or stripe");
            }
            c.header = opts.get("header").trim();
            if (c.header.isEmpty()) throw new IllegalArgumentException("header must not be empty");
            c.keys = loadKeys(c.scheme, env.getOrDefault("TXHOOK_SECRETS", ""));
            return c;
        }
    }

    /**
     * Turns the comma-separated secrets into HMAC keys. Errors name a secret by
     * position, never by content.
     */
    static List<byte[]> loadKeys(String scheme, String raw) {
        List<byte[]> keys = new ArrayList<>();
        int i = 0;
        for (String s : raw.split(",")) {
            s = s.trim();
            if (s.isEmpty()) continue;
            if (s.startsWith("whsk_") || s.startsWith("whpk_")) {
                throw new IllegalArgumentException("secrets[" + i + "]: ed25519 keys (v1a) are not supported by this example");
            }
            byte[] key;
            if (scheme.equals("standard")) {
                // "whsec_" + base64; the bare base64 part is accepted too.
                String enc = s.startsWith("whsec_") ? s.substring("whsec_".length()) : s;
                try {
                    key = Base64.getDecoder().decode(enc);
                } catch (IllegalArgumentException e) {
                    throw new IllegalArgumentException("secrets[" + i + "]: not base64 after whsec_");
                }
                if (key.length < 24 || key.length > 64) {
                    throw new IllegalArgumentException(
                            "secrets[" + i + "]: decodes to " + key.length + " bytes, want 24 to 64");
                }
            } else {
                // Stripe style: the secret string's bytes, as given.
                key = s.getBytes(StandardCharsets.UTF_8);
                if (key.length < 16) throw new IllegalArgumentException("secrets[" + i + "]: shorter than 16 bytes");
            }
            keys.add(key);
            i++;
        }
        if (keys.isEmpty()) throw new IllegalArgumentException("no secrets: set TXHOOK_SECRETS (comma-separated)");
        return keys;
    }

    // ------------------------------------------------------ verification

    static String singleHeader(HttpExchange ex, String name) throws Reject {
        List<String> values = ex.getRequestHeaders().get(name); // case-insensitive
        if (values != null && values.size() > 1) {
            // Two ids or timestamps: no telling which one the sender signed.
            throw new Reject(400, "header " + name + " appears more than once");
        }
        String value = values == null || values.isEmpty() ? "" : trimSpaceTab(values.get(0));
        if (value.isEmpty()) throw new Reject(401, "missing header " + name);
        return value;
    }

    static String trimSpaceTab(String s) {
        int b = 0, e = s.length();
        while (b < e && (s.charAt(b) == ' ' || s.charAt(b) == '\t')) b++;
        while (e > b && (s.charAt(e - 1) == ' ' || s.charAt(e - 1) == '\t')) e--;
        return s.substring(b, e);
    }

    static void checkTimestamp(String ts, long tolerance) throws Reject {
        if (!CANONICAL_UINT.matcher(ts).matches()) throw new Reject(400, "malformed timestamp");
        long sec;
        try {
            sec = Long.parseLong(ts);
        } catch (NumberFormatException e) {
            throw new Reject(400, "malformed timestamp");
        }
        double now = System.currentTimeMillis() / 1000.0;
        if (sec > MAX_UNIX || sec - now > tolerance) throw new Reject(401, "timestamp too new");
        if (now - sec > tolerance) throw new Reject(401, "timestamp too old");
    }

    static byte[] hmac(byte[] key, String prefix, byte[] body) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            mac.update(prefix.getBytes(StandardCharsets.ISO_8859_1));
            return mac.doFinal(body);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 unavailable", e);
        }
    }

    /** Returns the verified webhook-id. */
    static String verifyStandard(HttpExchange ex, byte[] body, List<byte[]> keys, long tolerance) throws Reject {
        String id = singleHeader(ex, "webhook-id");
        String ts = singleHeader(ex, "webhook-timestamp");
        String sigHeader = singleHeader(ex, "webhook-signature");
        if (!MESSAGE_ID.matcher(id).matches()) throw new Reject(400, "malformed webhook-id");
        List<byte[]> candidates = new ArrayList<>();
        int seen = 0, shaped = 0;
        for (String entry : sigHeader.split(" ")) {
            if (entry.isEmpty()) continue;
            if (++seen > MAX_ENTRIES) break;
            int comma = entry.indexOf(',');
            if (comma <= 0 || comma == entry.length() - 1) continue;
            shaped++;
            // Other versions (v1a, future ones) are skipped.
            if (entry.substring(0, comma).equals("v1")) {
                candidates.add(entry.substring(comma + 1).getBytes(StandardCharsets.ISO_8859_1));
            }
        }
        if (shaped == 0) throw new Reject(400, "malformed webhook-signature");
        checkTimestamp(ts, tolerance);

        String prefix = id + "." + ts + ".";
        for (byte[] key : keys) {
            // Comparing base64 text is comparing the bytes: the standard
            // encoding of 32 bytes has exactly one spelling.
            byte[] expected = Base64.getEncoder().encode(hmac(key, prefix, body));
            for (byte[] sig : candidates) {
                if (MessageDigest.isEqual(expected, sig)) return id;
            }
        }
        throw new Reject(401, "no matching signature");
    }

    static void verifyStripe(HttpExchange ex, byte[] body, List<byte[]> keys, long tolerance, String header)
            throws Reject {
        String value = singleHeader(ex, header);
        String ts = null;
        List<byte[]> sigs = new ArrayList<>();
        int seen = 0;
        for (String element : value.split(",", -1)) {
            element = trimSpaceTab(element);
            if (element.isEmpty()) continue;
            if (++seen > MAX_ENTRIES) break;
            int eq = element.indexOf('=');
            if (eq < 0) continue;
            String k = element.substring(0, eq), v = element.substring(eq + 1);
            if (k.equals("t")) {
                if (ts != null) throw new Reject(400, "more than one t= in signature header");
                ts = v;
            } else if (k.equals("v1") && HEX64.matcher(v).matches()) {
                sigs.add(decodeHex(v));
            } // unknown keys are ignored
        }
        if (ts == null || ts.isEmpty()) throw new Reject(400, "malformed signature header: no t=");
        checkTimestamp(ts, tolerance);
        if (sigs.isEmpty()) throw new Reject(401, "no v1 signature");

        String prefix = ts + ".";
        for (byte[] key : keys) {
            byte[] expected = hmac(key, prefix, body);
            for (byte[] sig : sigs) {
                if (MessageDigest.isEqual(expected, sig)) return;
            }
        }
        throw new Reject(401, "no matching signature");
    }

    /** Decodes hex already checked against HEX64. */
    static byte[] decodeHex(String s) {
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++) {
            b[i] = (byte) (hexDigit(s.charAt(2 * i)) << 4 | hexDigit(s.charAt(2 * i + 1)));
        }
        return b;
    }

    /** The value of an ASCII hex digit, or -1 (Character.digit also takes non-ASCII digits). */
    static int hexDigit(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    // ------------------------------------------------------------- dedup

    static final String NEW = "new", PROCESSING = "processing", DONE = "done";

    /**
     * Event ids seen, in memory: lost on restart, bounded to capacity (oldest
     * forgotten first). A production receiver uses a unique constraint in its
     * database or Redis SET NX instead.
     */
    static final class Dedup {
        private final LinkedHashMap<String, String> state = new LinkedHashMap<>(); // insertion order = age
        private final int capacity;

        Dedup(int capacity) {
            this.capacity = capacity;
        }

        /** NEW if the caller now owns id, else its current state. */
        synchronized String claim(String id) {
            String s = state.get(id);
            if (s != null) return s;
            state.put(id, PROCESSING);
            Iterator<String> oldest = state.keySet().iterator();
            while (state.size() > capacity) {
                oldest.next();
                oldest.remove();
            }
            return NEW;
        }

        synchronized void done(String id) {
            state.put(id, DONE);
        }

        /** Forgets a failed attempt so the sender's retry is processed. */
        synchronized void release(String id) {
            state.remove(id);
        }
    }

    /** The business logic. Event types we do not handle still get 200. */
    static void process(String id, Map<String, Object> event) {
        Object type = event.get("type");
        System.err.println("processed event " + id + " type=" + (type instanceof String ? "'" + type + "'" : type));
    }

    // -------------------------------------------------------------- HTTP

    final Config cfg;
    final Dedup dedup = new Dedup(DEDUP_CAPACITY);

    Receiver(Config cfg) {
        this.cfg = cfg;
    }

    void handle(HttpExchange ex) throws IOException {
        int status;
        String text;
        boolean close = false;
        try {
            if (!ex.getRequestMethod().equals("POST")) {
                ex.getResponseHeaders().set("Allow", "POST");
                throw new Reject(405, "method not allowed, use POST");
            }
            String[] result = handleWebhook(ex);
            status = Integer.parseInt(result[0]);
            text = result[1];
        } catch (Reject r) {
            status = r.status;
            text = r.getMessage();
            close = status == 413;
        } catch (RuntimeException e) {
            // A failed handler: the sender retries.
            System.err.println("receiver: handler failed: " + e.getClass().getSimpleName());
            status = 500;
            text = "internal error";
        }
        byte[] out = (text + "\n").getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "text/plain; charset=utf-8");
        ex.getResponseHeaders().set("X-Content-Type-Options", "nosniff");
        if (close) ex.getResponseHeaders().set("Connection", "close"); // body left unread
        ex.sendResponseHeaders(status, out.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(out);
        }
        ex.close();
    }

    static byte[] readBody(HttpExchange ex) throws IOException, Reject {
        String declared = ex.getRequestHeaders().getFirst("Content-Length");
        if (declared != null) {
            try {
                if (Long.parseLong(declared.trim()) > MAX_BODY) throw new Reject(413, "body over " + MAX_BODY + " bytes");
            } catch (NumberFormatException e) {
                throw new Reject(400, "malformed Content-Length");
            }
        }
        InputStream in = ex.getRequestBody();
        byte[] body = in.readNBytes(MAX_BODY + 1);
        if (body.length > MAX_BODY) throw new Reject(413, "body over " + MAX_BODY + " bytes");
        return body;
    }

    String[] handleWebhook(HttpExchange ex) throws Reject {
        byte[] body;
        try {
            body = readBody(ex);
        } catch (IOException e) {
            throw new Reject(400, "could not read body");
        }

        // 1. Verify the raw bytes, before any parsing.
        String id = null;
        if (cfg.scheme.equals("standard")) {
            id = verifyStandard(ex, body, cfg.keys, cfg.tolerance);
        } else {
            verifyStripe(ex, body, cfg.keys, cfg.tolerance, cfg.header);
        }

        // 2. Parse what the signature vouches for.
        Map<String, Object> event = Json.parseObject(body);
        if (id == null) {
            // Stripe style: the webhook-id header is not signed, so the id
            // comes from the signed body.
            Object v = event.get("id");
            if (!(v instanceof String) || !EVENT_ID.matcher((String) v).matches()) {
                throw new Reject(400, "body has no usable id (1 to 255 printable ASCII characters)");
            }
            id = (String) v;
        }

        // 3. Deduplicate before processing.
        String state = dedup.claim(id);
        if (state.equals(DONE)) return new String[] {"200", "duplicate " + id};
        if (state.equals(PROCESSING)) return new String[] {"409", "in progress " + id};
        try {
            process(id, event);
        } catch (RuntimeException e) {
            dedup.release(id);
            throw e;
        }
        dedup.done(id);
        return new String[] {"200", "processed " + id};
    }

    // -------------------------------------------------------------- JSON

    /**
     * A small strict JSON parser (RFC 8259), enough to read an event's
     * top-level fields without a library. Objects become Maps (last duplicate
     * key wins), arrays Lists, numbers Json.Number (never Strings, so that
     * {"id": 42} is not taken for {"id": "42"}), null Json.NULL.
     */
    static final class Json {
        static final Object NULL = new Object();

        /** A JSON number, kept as its source text. */
        static final class Number {
            final String text;

            Number(String text) {
                this.text = text;
            }

            @Override
            public String toString() {
                return text;
            }
        }

        static final int MAX_DEPTH = 256;
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        @SuppressWarnings("unchecked")
        static Map<String, Object> parseObject(byte[] body) throws Reject {
            String text;
            try {
                text = StandardCharsets.UTF_8.newDecoder()
                        .onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT)
                        .decode(ByteBuffer.wrap(body)).toString();
            } catch (CharacterCodingException e) {
                throw new Reject(400, "body is not JSON");
            }
            Json p = new Json(text);
            Object v;
            try {
                v = p.value(0);
                p.ws();
                if (p.i != text.length()) throw p.fail();
            } catch (IndexOutOfBoundsException e) {
                throw new Reject(400, "body is not JSON");
            }
            if (!(v instanceof Map)) throw new Reject(400, "body is not a JSON object");
            return (Map<String, Object>) v;
        }

        private Reject fail() {
            return new Reject(400, "body is not JSON");
        }

        private void ws() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        }

        private void expect(char c) throws Reject {
            if (s.charAt(i++) != c) throw fail();
        }

        private Object value(int depth) throws Reject {
            if (depth > MAX_DEPTH) throw fail();
            ws();
            char c = s.charAt(i);
            switch (c) {
                case '{': {
                    i++;
                    Map<String, Object> m = new LinkedHashMap<>();
                    ws();
                    if (s.charAt(i) == '}') {
                        i++;
                        return m;
                    }
                    while (true) {
                        ws();
                        String k = string();
                        ws();
                        expect(':');
                        m.put(k, value(depth + 1));
                        ws();
                        if (s.charAt(i) == ',') {
                            i++;
                            continue;
                        }
                        expect('}');
                        return m;
                    }
                }
                case '[': {
                    i++;
                    List<Object> l = new ArrayList<>();
                    ws();
                    if (s.charAt(i) == ']') {
                        i++;
                        return l;
                    }
                    while (true) {
                        l.add(value(depth + 1));
                        ws();
                        if (s.charAt(i) == ',') {
                            i++;
                            continue;
                        }
                        expect(']');
                        return l;
                    }
                }
                case '"':
                    return string();
                case 't':
                    return literal("true", Boolean.TRUE);
                case 'f':
                    return literal("false", Boolean.FALSE);
                case 'n':
                    return literal("null", NULL);
                default:
                    return number();
            }
        }

        private Object literal(String word, Object v) throws Reject {
            if (!s.startsWith(word, i)) throw fail();
            i += word.length();
            return v;
        }

        private Number number() throws Reject {
            int start = i;
            if (s.charAt(i) == '-') i++;
            if (s.charAt(i) == '0') {
                i++;
            } else {
                digits();
            }
            if (i < s.length() && s.charAt(i) == '.') {
                i++;
                digits();
            }
            if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
                i++;
                if (s.charAt(i) == '+' || s.charAt(i) == '-') i++;
                digits();
            }
            return new Number(s.substring(start, i));
        }

        private void digits() throws Reject {
            int start = i;
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
            if (i == start) throw fail();
        }

        private String string() throws Reject {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c < 0x20) throw fail();
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case '"': case '\\': case '/': b.append(e); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'n': b.append('\n'); break;
                    case 'r': b.append('\r'); break;
                    case 't': b.append('\t'); break;
                    case 'u': {
                        int cp = 0;
                        for (int k = 0; k < 4; k++) {
                            int d = hexDigit(s.charAt(i++));
                            if (d < 0) throw fail();
                            cp = cp << 4 | d;
                        }
                        b.append((char) cp);
                        break;
                    }
                    default:
                        throw fail();
                }
            }
        }
    }

    // -------------------------------------------------------------- main

    public static void main(String[] args) throws IOException {
        Config cfg;
        try {
            cfg = Config.parse(args, System.getenv());
        } catch (IllegalArgumentException e) {
            System.err.println("receiver: " + e.getMessage());
            System.exit(2);
            return;
        }
        // Headers and body go out in two writes; with Nagle's algorithm on,
        // the second waits for the client's delayed ACK (40 ms on Linux).
        System.setProperty("sun.net.httpserver.nodelay", "true");
        HttpServer server = HttpServer.create(new InetSocketAddress(cfg.host, cfg.port), 0);
        Receiver r = new Receiver(cfg);
        server.createContext("/", r::handle);
        // Several handler threads, so the "processing" state matters.
        server.setExecutor(Executors.newFixedThreadPool(16));
        server.start();
        // The first line of stdout says where we listen (port 0 picks one).
        System.out.println("LISTENING " + server.getAddress().getPort());
        System.out.flush();
        System.err.println("receiver: " + cfg.scheme + " scheme, " + cfg.keys.size() + " secret(s), tolerance "
                + cfg.tolerance + "s");
    }
}
