package main

import (
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

// partSigner runs signing and verification micro-benchmarks with
// testing.Benchmark: the cases of signer/bench_test.go (a 1 KiB body), so
// that `go test -run '^$' -bench . -benchmem ./signer` gives comparable
// figures.
func partSigner(cfg config, rep *report, p *progress) error {
	testing.Init()
	if err := flag.Set("test.benchtime", cfg.SignerBenchtime.String()); err != nil {
		return err
	}
	secret1, err := signer.GenerateSecret()
	if err != nil {
		return err
	}
	secret2, err := signer.GenerateSecret()
	if err != nil {
		return err
	}
	edPriv, edPub, err := signer.GenerateKeyPair()
	if err != nil {
		return err
	}
	const stripe1, stripe2 = "sk_bench_secret_0123456789abcdef", "sk_bench_secret_fedcba9876543210"
	body := bytes.Repeat([]byte("x"), 1024)
	ts := time.Unix(1700000000, 0)
	at := func() time.Time { return ts }
	const id = "msg_01HZX3V9K8Q2W7E5R4T6Y1U0IO"

	sign := func(s signer.Signer, secrets ...string) func(*testing.B) {
		return func(b *testing.B) {
			h := http.Header{}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Sign(h, id, ts, body, secrets); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	verify := func(s signer.Signer, v signer.Verifier, signWith, checkWith []string) func(*testing.B) {
		return func(b *testing.B) {
			h := http.Header{}
			if err := s.Sign(h, id, ts, body, signWith); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(h, body, checkWith); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	cases := []struct {
		name string
		fn   func(*testing.B)
	}{
		{"SignStandard/one secret", sign(signer.Standard{}, secret1)},
		{"SignStandard/rotation", sign(signer.Standard{}, secret1, secret2)},
		{"SignStandard/ed25519", sign(signer.Standard{}, edPriv)},
		{"SignStripe/one secret", sign(signer.Stripe{}, stripe1)},
		{"SignStripe/rotation", sign(signer.Stripe{}, stripe1, stripe2)},
		{"VerifyStandard/one secret", verify(signer.Standard{}, signer.Standard{Now: at}, []string{secret1}, []string{secret1})},
		{"VerifyStandard/rotation, new secret", verify(signer.Standard{}, signer.Standard{Now: at}, []string{secret1, secret2}, []string{secret2})},
		{"VerifyStandard/ed25519", verify(signer.Standard{}, signer.Standard{Now: at}, []string{edPriv}, []string{edPub})},
		{"VerifyStripe/one secret", verify(signer.Stripe{}, signer.Stripe{Now: at}, []string{stripe1}, []string{stripe1})},
		{"VerifyStripe/rotation, new secret", verify(signer.Stripe{}, signer.Stripe{Now: at}, []string{stripe1, stripe2}, []string{stripe2})},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-38s %8s %8s %6s %10s\n", "benchmark (1 KiB body)", "ns/op", "MB/s", "B/op", "allocs/op")
	for _, c := range cases {
		r := testing.Benchmark(c.fn)
		if r.N == 0 {
			return fmt.Errorf("benchmark %s failed", c.name)
		}
		mbs := float64(r.Bytes) * float64(r.N) / r.T.Seconds() / 1e6
		fmt.Fprintf(&b, "%-38s %8d %8.1f %6d %10d\n", c.name, r.NsPerOp(), mbs, r.AllocedBytesPerOp(), r.AllocsPerOp())
		p.logf("signer %s: %d ns/op, %d allocs/op", c.name, r.NsPerOp(), r.AllocsPerOp())
	}
	rep.section("Signing and verification (testing.Benchmark in the bench process; same cases as `go test -run '^$' -bench . -benchmem ./signer`)", b.String())
	return nil
}
