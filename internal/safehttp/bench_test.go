package safehttp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
)

// The relay's case: many concurrent POSTs of a small signed JSON body to one
// receiver that answers 200 with an empty body. BenchmarkPlainPost does the
// same with a bare http.Client (same pool size), so the difference is what
// the guard, the limits and the Result cost. The allocation figures include
// the in-process httptest server's, which are the same for both.

var (
	benchBody   = []byte(`{"id":"evt_01J8Z3K4Q5R6S7T8V9W0X1Y2Z3","type":"payment.succeeded","created":1767225600,"data":{"payment_id":"pay_123","amount":4200,"currency":"EUR"}}`)
	benchHeader = http.Header{
		"Content-Type":    {"application/json"},
		"X-Kxp-Signature": {"t=1767225600,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd"},
		"Webhook-Id":      {"evt_01J8Z3K4Q5R6S7T8V9W0X1Y2Z3"},
	}
)

func benchServer(b *testing.B) *testServer {
	return startServer(b, plainHTTP, func(w http.ResponseWriter, r *http.Request) {})
}

func BenchmarkPost(b *testing.B) {
	srv := benchServer(b)
	c := New(private)
	defer c.CloseIdleConnections()
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(8) // 16 in flight on 2 cores, as in the reference baseline
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if res := c.Post(ctx, srv.URL, benchHeader, benchBody); !res.OK() {
				b.Error(res.Err)
				return
			}
		}
	})
}

func BenchmarkPlainPost(b *testing.B) {
	srv := benchServer(b)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(benchBody))
			if err != nil {
				b.Error(err)
				return
			}
			req.Header = benchHeader
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Error(resp.Status)
				return
			}
		}
	})
}
