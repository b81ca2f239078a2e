package signer_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

var benchBody = bytes.Repeat([]byte("x"), 1024)

func benchSign(b *testing.B, s signer.Signer, secrets ...string) {
	ts := time.Unix(1700000000, 0)
	h := http.Header{}
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Sign(h, "msg_01HZX3V9K8Q2W7E5R4T6Y1U0IO", ts, benchBody, secrets); err != nil {
			b.Fatal(err)
		}
	}
}

func benchVerify(b *testing.B, s signer.Signer, v signer.Verifier, signWith, checkWith []string) {
	h := http.Header{}
	if err := s.Sign(h, "msg_01HZX3V9K8Q2W7E5R4T6Y1U0IO", time.Unix(1700000000, 0), benchBody, signWith); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(h, benchBody, checkWith); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSignStandard(b *testing.B) {
	b.Run("one secret", func(b *testing.B) { benchSign(b, signer.Standard{}, specSecret) })
	b.Run("rotation", func(b *testing.B) { benchSign(b, signer.Standard{}, specSecret, rustSecret) })
	b.Run("ed25519", func(b *testing.B) { benchSign(b, signer.Standard{}, edFullKey) })
}

func BenchmarkSignStripe(b *testing.B) {
	b.Run("one secret", func(b *testing.B) { benchSign(b, signer.Stripe{}, stripeSecret1) })
	b.Run("rotation", func(b *testing.B) { benchSign(b, signer.Stripe{}, stripeSecret1, stripeSecret2) })
}

func BenchmarkVerifyStandard(b *testing.B) {
	v := signer.Standard{Now: clockAt(1700000000)}
	b.Run("one secret", func(b *testing.B) {
		benchVerify(b, signer.Standard{}, v, []string{specSecret}, []string{specSecret})
	})
	b.Run("rotation, new secret", func(b *testing.B) {
		benchVerify(b, signer.Standard{}, v, []string{specSecret, rustSecret}, []string{rustSecret})
	})
	b.Run("ed25519", func(b *testing.B) {
		benchVerify(b, signer.Standard{}, v, []string{edFullKey}, []string{edPubKey})
	})
}

func BenchmarkVerifyStripe(b *testing.B) {
	v := signer.Stripe{Now: clockAt(1700000000)}
	b.Run("one secret", func(b *testing.B) {
		benchVerify(b, signer.Stripe{}, v, []string{stripeSecret1}, []string{stripeSecret1})
	})
	b.Run("rotation, new secret", func(b *testing.B) {
		benchVerify(b, signer.Stripe{}, v, []string{stripeSecret1, stripeSecret2}, []string{stripeSecret2})
	})
}
