package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/txhook/txhook/outbox"
)

// partSecrets drains a backlog spread over many endpoints with their
// signing secrets encrypted at rest (Config.SecretCipher, AES-256-GCM)
// against the same drain with plaintext secrets, alternating rounds, on
// PostgreSQL (pgx) when a DSN is set and SQLite otherwise. Relays decrypt
// each endpoint's secrets once and keep them in memory, so the difference
// should be noise; a micro-benchmark gives the cost of one decryption.
func partSecrets(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	cipher, err := outbox.NewAESGCM(outbox.AESKey{ID: "bench", Key: key})
	if err != nil {
		return err
	}
	backend := "SQLite (WAL file)"
	if cfg.DSN != "" {
		backend = "PostgreSQL (pgx)"
	}
	drain := func(c outbox.Cipher) (drainResult, error) {
		obCfg := localOutbox()
		obCfg.SecretCipher = c
		if cfg.DSN == "" {
			s, err := newSQLite(ctx, obCfg)
			if err != nil {
				return drainResult{}, err
			}
			defer s.drop()
			return secretsDrain(ctx, s.db, "", s.ob, rcv.URL, cfg)
		}
		s, err := newSchema(ctx, cfg.DSN, "pgx", 16, obCfg)
		if err != nil {
			return drainResult{}, err
		}
		defer s.drop()
		return secretsDrain(ctx, s.db, s.name, s.ob, rcv.URL, cfg)
	}
	var off, on []drainResult
	for round := range cfg.SecretsRounds {
		arms := []outbox.Cipher{nil, cipher}
		if round%2 == 1 {
			arms[0], arms[1] = arms[1], arms[0]
		}
		for _, c := range arms {
			r, err := drain(c)
			if err != nil {
				return err
			}
			if c == nil {
				off = append(off, r)
			} else {
				on = append(on, r)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		p.logf("secrets round %d/%d: plaintext %s/s, encrypted %s/s (%.2f×)", round+1, cfg.SecretsRounds,
			rate(off[round].rate), rate(on[round].rate), on[round].rate/off[round].rate)
	}
	offR, onR := median(drainRates(off)), median(drainRates(on))
	rep.add(row{
		Part: fmt.Sprintf("drain, secrets encrypted at rest, %s, %d in flight, %s backlog over %s endpoints (deliveries/s)",
			backend, cfg.SecretsConc, commas(int64(cfg.SecretsEvents)), commas(int64(cfg.SecretsEndpoints))),
		Value:    rate(onR),
		Baseline: rate(offR) + " (plaintext secrets)",
		Ratio:    ratio(onR / offR),
	})
	if c := cpuSummary(on, cfg.DSN != ""); c != "" {
		rep.add(row{
			Part:     "… CPU per delivery, secrets encrypted (µs)",
			Value:    c,
			Baseline: cpuSummary(off, cfg.DSN != "") + " (plaintext)",
		})
	}

	// One decryption of a typical stored value: two whsec_ secrets.
	testing.Init()
	if err := flag.Set("test.benchtime", cfg.SignerBenchtime.String()); err != nil {
		return err
	}
	plain, _ := json.Marshal([]map[string]any{
		{"secret": "whsec_" + strings.Repeat("A", 44), "expires_at": nil},
		{"secret": "whsec_" + strings.Repeat("B", 44), "expires_at": "2026-12-01T12:00:00Z"},
	})
	ad := []byte("txhook_endpoints.secrets\x00ep_01JD0000000000000000000000")
	kid, ct, err := cipher.Encrypt(ctx, plain, ad)
	if err != nil {
		return err
	}
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := cipher.Decrypt(ctx, kid, ct, ad); err != nil {
				b.Fatal(err)
			}
		}
	})
	rep.add(row{
		Part:  fmt.Sprintf("… AES-256-GCM decryption of one endpoint's secrets (%d bytes; once per endpoint and relay) (µs)", len(plain)),
		Value: fmt.Sprintf("%.2f", float64(res.NsPerOp())/1e3),
	})
	rep.section("Drain rounds, secrets encrypted at rest ("+backend+")", fmt.Sprintf("%d in flight, %d rounds\n  plaintext /s: %s\n  encrypted /s: %s",
		cfg.SecretsConc, len(on), rates(drainRates(off)), rates(drainRates(on))))
	return nil
}

// secretsDrain creates cfg.SecretsEndpoints endpoints at url, one per
// tenant, enqueues cfg.SecretsEvents events spread over the tenants, and
// times a relay delivering them.
func secretsDrain(ctx context.Context, db *sql.DB, appName string, ob *outbox.Outbox, url string, cfg config) (drainResult, error) {
	tenants := cfg.SecretsEndpoints
	for i := range tenants {
		if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: fmt.Sprint("t", i), URL: url}); err != nil {
			return drainResult{}, err
		}
	}
	for i := 0; i < cfg.SecretsEvents; i += 500 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return drainResult{}, err
		}
		for k := i; k < min(cfg.SecretsEvents, i+500); k++ {
			if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: fmt.Sprint("t", k%tenants), Type: "payment.succeeded", Payload: benchPayload}); err != nil {
				tx.Rollback()
				return drainResult{}, err
			}
		}
		if err := tx.Commit(); err != nil {
			return drainResult{}, err
		}
	}
	return timeDrain(ctx, db, appName, ob, cfg.SecretsConc, cfg.SecretsEvents, appName != "", false)
}
