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
)

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

// envelopeLike is a body the size and shape of what the relay sends for
// benchPayload.
func envelopeLike() []byte {
	b := []byte(`{"id":"01JD0000000000000000000000","type":"payment.succeeded","timestamp":"2026-11-30T12:00:00.000000Z","data":`)
	b = append(b, benchPayload...)
	return append(b, '}')
}

// bareLoop POSTs total requests from conc goroutines with a plain
// net/http client, keep-alive, the same body and headers of the same size
// as the relay's (signature precomputed): the cost of the HTTP alone, the
// drain's baseline. It returns requests per second.
func bareLoop(url string, conc, total int) (float64, error) {
	body := envelopeLike()
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	hdr := http.Header{
		"Content-Type":       {"application/json"},
		"User-Agent":         {"txhook/1 (+https://github.com/txhook/txhook)"},
		"Webhook-Id":         {"01JD0000000000000000000000"},
		"Webhook-Event-Type": {"payment.succeeded"},
		"Webhook-Timestamp":  {"1764504000"},
		"Webhook-Signature":  {"v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="},
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hdr := hdr.Clone()
			for next.Add(1) <= int64(total) {
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if err == nil {
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
