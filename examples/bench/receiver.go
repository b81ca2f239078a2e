package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/txhook/txhook/signer"
)

// userAgent is the relay's User-Agent, which the bare loop sends too.
var userAgent = []string{"txhook/1 (+https://github.com/txhook/txhook)"}

// receiver is a local no-op webhook receiver: it reads the body and answers
// 204. When a recorder is set it also notes the arrival time of each
// event's sequence number ("seq" in the payload).
type receiver struct {
	URL  string
	srv  *http.Server
	n    atomic.Int64
	rec  atomic.Pointer[recorder]
	bufs sync.Pool
}

// recorder keeps first-arrival times, in nanoseconds since base, by seq.
type recorder struct {
	base time.Time
	at   []atomic.Int64
	dups atomic.Int64
}

func newRecorder(base time.Time, n int) *recorder {
	return &recorder{base: base, at: make([]atomic.Int64, n)}
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{URL: "http://" + ln.Addr().String() + "/hook"}
	r.bufs.New = func() any { return new(bytes.Buffer) }
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

func (r *receiver) close() { r.srv.Close() }

var seqKey = []byte(`"seq":`)

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rec := r.rec.Load()
	if rec == nil {
		io.Copy(io.Discard, req.Body)
	} else {
		now := time.Now()
		b := r.bufs.Get().(*bytes.Buffer)
		b.Reset()
		b.ReadFrom(req.Body)
		if seq, ok := parseSeq(b.Bytes()); ok && seq >= 0 && seq < int64(len(rec.at)) {
			if !rec.at[seq].CompareAndSwap(0, int64(now.Sub(rec.base))) {
				rec.dups.Add(1)
			}
		}
		r.bufs.Put(b)
	}
	r.n.Add(1)
	w.WriteHeader(http.StatusNoContent)
}

func parseSeq(body []byte) (int64, bool) {
	i := bytes.Index(body, seqKey)
	if i < 0 {
		return 0, false
	}
	rest := body[i+len(seqKey):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return n, err == nil
}

// bareEnvelope appends to b the body the relay sends for an event of
// benchPayload: the Standard Webhooks envelope with the event's own ID and
// time, the payload copied in.
func bareEnvelope(b []byte, id string, at time.Time) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","type":"payment.succeeded","version":1,"timestamp":"`...)
	b = at.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
	b = append(b, `","data":`...)
	b = append(b, benchPayload...)
	return append(b, '}')
}

// bareLoop POSTs total requests from conc goroutines with a plain
// net/http client and keep-alive, doing per request what the relay does
// besides the database: a new event ID and time, the envelope around the
// payload, the relay's headers, and a Standard Webhooks HMAC-SHA256
// signature over them. It is the drain's baseline, as the issue defines
// it: same envelope, HMAC and POST, no database. It returns requests per
// second.
func bareLoop(url string, conc, total int) (float64, error) {
	secret, err := signer.GenerateSecret()
	if err != nil {
		return 0, err
	}
	secrets := []string{secret}
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	entropy := ulid.DefaultEntropy()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				now := time.Now()
				id := ulid.MustNew(ulid.Timestamp(now), entropy).String()
				body := bareEnvelope(make([]byte, 0, len(benchPayload)+128), id, now)
				hdr := http.Header{
					"Content-Type":          {"application/json"},
					"Webhook-Id":            {id},
					"Webhook-Event-Type":    {"payment.succeeded"},
					"Webhook-Event-Version": {"1"},
				}
				err := signer.Standard{}.Sign(hdr, id, now, body, secrets)
				var req *http.Request
				if err == nil {
					req, err = http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				}
				if err == nil {
					hdr["User-Agent"] = userAgent
					req.Header = hdr
					var resp *http.Response
					if resp, err = c.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode/100 != 2 {
							err = fmt.Errorf("HTTP %d", resp.StatusCode)
						}
					}
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	if total <= 0 {
		return 0, errors.New("bare loop: nothing to send")
	}
	return float64(total) / el.Seconds(), nil
}
