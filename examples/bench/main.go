// Command bench measures txhook against baselines run in the same process
// and the same run, on PostgreSQL and SQLite, prints a table and writes
// docs/BENCHMARKS.md.
//
//	go run ./examples/bench
//
// The PostgreSQL parts run on a throwaway cluster the bench starts
// (internal/pgcluster: initdb into a temporary directory, a free loopback
// port, the production settings of pgcluster.Production(), autovacuum on),
// whose settings the report prints; it needs the server binaries
// (/usr/lib/postgresql/<version>/bin). To run them on a server of your own
// instead:
//
//	TXHOOK_BENCH_POSTGRES_DSN='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	    go run ./examples/bench -cluster=false
//
// Parts (all by default; -only takes a comma-separated list):
//
//   - enqueue: transactions {INSERT payment; Enqueue} against {INSERT
//     payment; one plain INSERT of the same payload}, 16 connections, lib/pq
//     and pgx, alternating rounds.
//   - drain: a backlog delivered to a local no-op receiver at 16 and 100
//     requests in flight, against a bare HTTP POST loop at the same
//     concurrency (per request: the envelope with a new event ID, the
//     relay's headers, a Standard Webhooks HMAC, the POST; no database),
//     alternating rounds.
//   - latency: commit-to-receipt percentiles under an open-loop generator at
//     fixed rates, default relay settings.
//   - fairness: the same for one tenant at a fixed rate beside hostile
//     tenants (hanging receivers, endpoints limited to 0.01/s, open
//     circuits), against that tenant alone; beside them twice, with the
//     relays' shared gates off and on, counting the claims each hands
//     back unused (issue 25 §5).
//   - backlog: one claim batch (the dispatch statement and the retry claim
//     statement) with a small and a large backlog, and the peak RSS of a
//     separate relay process draining the large one.
//   - partition: retention of -partition-rows rows by DELETE (Prune on
//     plain tables) against dropping partitions (Prune on tables made by
//     Outbox.Partition), time and WAL bytes, and the claim and a lookup by
//     delivery ID with those rows retained; on a PostgreSQL cluster of its
//     own (internal/pgcluster, Production settings), without the DSN.
//   - sqlite: the drain on SQLite.
//   - secrets: a drain over many endpoints with their signing secrets
//     encrypted at rest (Config.SecretCipher) against plaintext secrets,
//     alternating rounds, on PostgreSQL (pgx), or SQLite without the DSN;
//     and the cost of one decryption.
//   - signer: signing and verification micro-benchmarks.
//   - recover: Outbox.Recover of one endpoint beside -recover-rows events
//     (and half as many deliveries) of -recover-tenants other tenants, with
//     the index of unrouted events by tenant (migration 010) against the
//     index of migration 009, alternating, with both plans; and the WAL
//     each index costs an event dispatched to no endpoint.
//   - relays: 1, 2 and 4 relay processes (this program in relay mode) on
//     one PostgreSQL cluster of their own (internal/pgcluster, Production
//     settings and pg_stat_statements; needs the server binaries, not the
//     DSN), draining a backlog and at a steady enqueue rate: deliveries/s,
//     polls that found nothing, lock waits, CPU, WAL and rows written per
//     delivery, table size per event.
//   - broker: broker mode (outbox/broker) beside table mode, on a payment
//     and a history PostgreSQL cluster of its own and one nats-server
//     (internal/natscluster): the payment database's CPU and WAL per
//     event at a steady rate against Enqueue alone, drains by 1, 2 and 4
//     worker processes (this program in broker-worker mode) against as
//     many relay processes, and commit→receipt latency against a
//     table-mode relay, alternating rounds.
//
// With -cluster=false, PostgreSQL parts are skipped when
// TXHOOK_BENCH_POSTGRES_DSN is unset.
// Each part works in schemas (or files) of its own and drops them after.
//
// The machine is assumed shared and noisy: txhook and its baseline run in
// alternating rounds and the table gives medians. Beside rates it reports
// CPU time per transaction or delivery, of this process and of the
// PostgreSQL backends serving it (from /proc, so with a server on this
// machine), which the neighbours' load moves much less than rates.
// -cpuprofile profiles the whole run; use it with -only.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
)

// EnvDSN names the environment variable with the PostgreSQL DSN.
const EnvDSN = "TXHOOK_BENCH_POSTGRES_DSN"

// allParts lists the parts in the order they run.
var allParts = []string{"enqueue", "drain", "latency", "fairness", "backlog", "recover", "partition", "sqlite", "secrets", "signer", "relays", "broker"}

// config holds every knob of a run; defaults are the published settings.
type config struct {
	DSN   string
	Parts []string

	EnqueueConns   int
	EnqueueRound   time.Duration
	EnqueueRounds  int
	EnqueueDrivers []string

	DrainEvents int
	DrainConc   []int
	DrainRounds int

	LatencyRates  []int
	LatencyWarmup time.Duration
	LatencyDur    time.Duration
	// The generator: goroutines committing business transactions on a
	// pool of LatencyPool connections, which the relay shares unless
	// LatencyRelayPool gives it a pool of its own. 0: the defaults.
	LatencyWorkers   int
	LatencyPool      int
	LatencyRelayPool int

	FairnessRate int // the calm tenant's events per second

	BacklogSmall int
	BacklogLarge int
	ClaimSamples int
	RSSEvents    int // events the separate relay process drains; 0 skips the RSS measure
	RSSTimeout   time.Duration

	RecoverRows    int // other tenants' events beside the recovering one's
	RecoverTenants int
	RecoverRounds  int
	// RecoverWALEvents are the unrouted events whose WAL is measured.
	RecoverWALEvents int

	PartitionRows int // rows retained and pruned (a third each events, deliveries, attempts)
	PartitionDays int // days they span, one partition a day

	SQLiteEvents int
	SQLiteConc   int
	SQLiteRounds int

	SecretsEvents    int
	SecretsEndpoints int
	SecretsConc      int
	SecretsRounds    int

	SignerBenchtime time.Duration

	RelaysCounts []int         // relay processes per run; the first is the baseline
	RelaysEvents int           // backlog drained by each run
	RelaysRate   int           // steady runs: events per second
	RelaysSteady time.Duration // steady runs: how long events are enqueued
	RelaysRounds int

	BrokerCounts        []int         // worker (and relay) processes of the drains
	BrokerEvents        int           // backlog each drain delivers
	BrokerRate          int           // steady runs: events per second
	BrokerSteady        time.Duration // steady runs: how long events are enqueued
	BrokerRounds        int           // rounds of the steady runs and drains (alternating order)
	BrokerLatencyRate   int           // latency runs: events per second
	BrokerLatencyRounds int           // latency runs: rounds per mode (alternating)

	Revision string // the txhook revision measured, for the report

	NotifyInterval time.Duration // Config.NotifyInterval for enqueue and latency; 0 is the default

	// Settings are the PostgreSQL server's non-default settings, printed
	// in the report when the bench started the cluster itself.
	Settings []pgcluster.Setting
}

func defaultConfig() config {
	return config{
		Parts:            allParts,
		EnqueueConns:     16,
		EnqueueRound:     time.Second,
		EnqueueRounds:    15,
		EnqueueDrivers:   []string{"postgres", "pgx"},
		DrainEvents:      20000,
		DrainConc:        []int{16, 100},
		DrainRounds:      5,
		LatencyRates:     []int{500, 2000},
		LatencyWarmup:    3 * time.Second,
		LatencyDur:       15 * time.Second,
		LatencyWorkers:   defaultLatencyWorkers,
		LatencyPool:      defaultLatencyPool,
		FairnessRate:     100,
		BacklogSmall:     10000,
		BacklogLarge:     1000000,
		ClaimSamples:     25,
		RSSEvents:        1000000,
		RSSTimeout:       6 * time.Minute,
		RecoverRows:      1000000,
		RecoverTenants:   1000,
		RecoverRounds:    3,
		RecoverWALEvents: 20000,
		PartitionRows:    10000000,
		PartitionDays:    10,
		SQLiteEvents:     20000,
		SQLiteConc:       16,
		SQLiteRounds:     5,
		SecretsEvents:    20000,
		SecretsEndpoints: 1000,
		SecretsConc:      16,
		SecretsRounds:    5,
		SignerBenchtime:  time.Second,
		RelaysCounts:     []int{1, 2, 4},
		RelaysEvents:     20000,
		RelaysRate:       1000,
		RelaysSteady:     10 * time.Second,
		RelaysRounds:     2,

		BrokerCounts:        []int{1, 2, 4},
		BrokerEvents:        20000,
		BrokerRate:          1000,
		BrokerSteady:        10 * time.Second,
		BrokerRounds:        2,
		BrokerLatencyRate:   500,
		BrokerLatencyRounds: 3,
	}
}

func (c config) has(part string) bool {
	for _, p := range c.Parts {
		if p == part {
			return true
		}
	}
	return false
}

func main() {
	if os.Getenv(envChild) != "" {
		os.Exit(relayChild())
	}
	cfg := defaultConfig()
	only := flag.String("only", "", "comma-separated parts to run: "+strings.Join(allParts, ", ")+" (default all)")
	out := flag.String("out", "docs/BENCHMARKS.md", "markdown report to write (\"\" for none); with -only, written only when given explicitly")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.IntVar(&cfg.EnqueueConns, "enqueue-conns", cfg.EnqueueConns, "enqueue: connections (and goroutines)")
	flag.DurationVar(&cfg.EnqueueRound, "enqueue-round", cfg.EnqueueRound, "enqueue: duration of one round of one arm")
	flag.IntVar(&cfg.EnqueueRounds, "enqueue-rounds", cfg.EnqueueRounds, "enqueue: rounds per arm (alternating)")
	drivers := flag.String("enqueue-drivers", strings.Join(cfg.EnqueueDrivers, ","), "enqueue: database/sql drivers")
	flag.IntVar(&cfg.DrainEvents, "drain-events", cfg.DrainEvents, "drain: backlog size")
	drainConc := flag.String("drain-conc", joinInts(cfg.DrainConc), "drain: requests in flight, comma-separated")
	flag.IntVar(&cfg.DrainRounds, "drain-rounds", cfg.DrainRounds, "drain: rounds per concurrency (alternating with the bare loop)")
	rates := flag.String("latency-rates", joinInts(cfg.LatencyRates), "latency: events per second, comma-separated")
	flag.DurationVar(&cfg.LatencyWarmup, "latency-warmup", cfg.LatencyWarmup, "latency: warm-up before measuring")
	flag.DurationVar(&cfg.LatencyDur, "latency-dur", cfg.LatencyDur, "latency: measured duration per rate")
	flag.IntVar(&cfg.LatencyWorkers, "latency-workers", cfg.LatencyWorkers, "latency: goroutines committing business transactions")
	flag.IntVar(&cfg.LatencyPool, "latency-pool", cfg.LatencyPool, "latency: connections of the pool the generator (and the relay, unless -latency-relay-pool) use")
	flag.IntVar(&cfg.LatencyRelayPool, "latency-relay-pool", 0, "latency: connections of a pool of the relay's own (0: the relay shares the generator's pool, as a service running its relay in-process)")
	flag.IntVar(&cfg.FairnessRate, "fairness-rate", cfg.FairnessRate, "fairness: the calm tenant's events per second (warm-up and duration as for latency)")
	flag.IntVar(&cfg.BacklogSmall, "backlog-small", cfg.BacklogSmall, "backlog: small backlog size")
	flag.IntVar(&cfg.BacklogLarge, "backlog-large", cfg.BacklogLarge, "backlog: large backlog size")
	flag.IntVar(&cfg.ClaimSamples, "claim-samples", cfg.ClaimSamples, "backlog: timed claim batches per statement and size")
	flag.IntVar(&cfg.RSSEvents, "rss-events", cfg.RSSEvents, "backlog: events the separate relay drains while its RSS is sampled (0: skip)")
	flag.DurationVar(&cfg.RSSTimeout, "rss-timeout", cfg.RSSTimeout, "backlog: longest the RSS drain may run")
	flag.IntVar(&cfg.RecoverRows, "recover-rows", cfg.RecoverRows, "recover: events of other tenants (half unrouted, half with a delivery)")
	flag.IntVar(&cfg.RecoverTenants, "recover-tenants", cfg.RecoverTenants, "recover: other tenants the rows belong to")
	flag.IntVar(&cfg.RecoverWALEvents, "recover-wal-events", cfg.RecoverWALEvents, "recover: unrouted events whose WAL each index costs")
	flag.IntVar(&cfg.RecoverRounds, "recover-rounds", cfg.RecoverRounds, "recover: rounds per index (alternating)")
	flag.IntVar(&cfg.PartitionRows, "partition-rows", cfg.PartitionRows, "partition: rows retained then pruned, a third each in events, deliveries and attempts")
	flag.IntVar(&cfg.PartitionDays, "partition-days", cfg.PartitionDays, "partition: days the rows span (one partition a day)")
	flag.IntVar(&cfg.SQLiteEvents, "sqlite-events", cfg.SQLiteEvents, "sqlite: backlog size")
	flag.IntVar(&cfg.SQLiteConc, "sqlite-conc", cfg.SQLiteConc, "sqlite: requests in flight")
	flag.IntVar(&cfg.SQLiteRounds, "sqlite-rounds", cfg.SQLiteRounds, "sqlite: rounds (alternating with the bare loop)")
	flag.IntVar(&cfg.SecretsEvents, "secrets-events", cfg.SecretsEvents, "secrets: backlog size")
	flag.IntVar(&cfg.SecretsEndpoints, "secrets-endpoints", cfg.SecretsEndpoints, "secrets: endpoints (one per tenant) the backlog is spread over")
	flag.IntVar(&cfg.SecretsConc, "secrets-conc", cfg.SecretsConc, "secrets: requests in flight")
	flag.IntVar(&cfg.SecretsRounds, "secrets-rounds", cfg.SecretsRounds, "secrets: rounds per arm (alternating)")
	flag.DurationVar(&cfg.SignerBenchtime, "signer-benchtime", cfg.SignerBenchtime, "signer: time per micro-benchmark")
	relaysCounts := flag.String("relays-counts", joinInts(cfg.RelaysCounts), "relays: relay processes per run, comma-separated (the first is the baseline)")
	flag.IntVar(&cfg.RelaysEvents, "relays-events", cfg.RelaysEvents, "relays: backlog each run drains")
	flag.IntVar(&cfg.RelaysRate, "relays-rate", cfg.RelaysRate, "relays: events per second of the steady runs")
	flag.DurationVar(&cfg.RelaysSteady, "relays-steady", cfg.RelaysSteady, "relays: how long the steady runs enqueue")
	flag.IntVar(&cfg.RelaysRounds, "relays-rounds", cfg.RelaysRounds, "relays: rounds (the order of the relay counts alternates)")
	brokerCounts := flag.String("broker-counts", joinInts(cfg.BrokerCounts), "broker: worker processes (and table-mode relay processes) of the drains, comma-separated")
	flag.IntVar(&cfg.BrokerEvents, "broker-events", cfg.BrokerEvents, "broker: backlog each drain delivers")
	flag.IntVar(&cfg.BrokerRate, "broker-rate", cfg.BrokerRate, "broker: events per second of the steady runs")
	flag.DurationVar(&cfg.BrokerSteady, "broker-steady", cfg.BrokerSteady, "broker: how long the steady runs enqueue")
	flag.IntVar(&cfg.BrokerRounds, "broker-rounds", cfg.BrokerRounds, "broker: rounds of the steady runs and drains (the order of the arms alternates)")
	flag.IntVar(&cfg.BrokerLatencyRate, "broker-latency-rate", cfg.BrokerLatencyRate, "broker: events per second of the latency runs (warm-up and duration as for latency)")
	flag.IntVar(&cfg.BrokerLatencyRounds, "broker-latency-rounds", cfg.BrokerLatencyRounds, "broker: latency rounds per mode (alternating)")
	flag.DurationVar(&cfg.NotifyInterval, "notify-interval", 0, "Config.NotifyInterval for the enqueue and latency parts (0: the default; negative: no NOTIFY)")
	flag.StringVar(&cfg.Revision, "revision", "", "txhook revision to name in the report (default: asked of git)")
	cluster := flag.Bool("cluster", true, "run the PostgreSQL parts on a throwaway cluster the bench starts (internal/pgcluster, production settings, autovacuum on) instead of the server "+EnvDSN+" names")
	flag.Parse()

	var err error
	cfg.DSN = os.Getenv(EnvDSN)
	if *cluster {
		cfg.DSN = ""
	}
	cfg.EnqueueDrivers = splitList(*drivers)
	if cfg.DrainConc, err = parseInts(*drainConc); err != nil {
		fail(fmt.Errorf("-drain-conc: %w", err))
	}
	if cfg.LatencyRates, err = parseInts(*rates); err != nil {
		fail(fmt.Errorf("-latency-rates: %w", err))
	}
	if cfg.RelaysCounts, err = parseInts(*relaysCounts); err != nil || len(cfg.RelaysCounts) == 0 {
		fail(fmt.Errorf("-relays-counts: %v", err))
	}
	if cfg.BrokerCounts, err = parseInts(*brokerCounts); err != nil || len(cfg.BrokerCounts) == 0 {
		fail(fmt.Errorf("-broker-counts: %v", err))
	}
	outSet := false
	flag.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
	if *only != "" {
		cfg.Parts = splitList(*only)
		for _, p := range cfg.Parts {
			if !contains(allParts, p) {
				fail(fmt.Errorf("-only: unknown part %q (want %s)", p, strings.Join(allParts, ", ")))
			}
		}
		if !outSet {
			*out = ""
		}
	}

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var c *pgcluster.Cluster
	if *cluster && needsPostgres(cfg) {
		if c, err = startCluster(ctx, &cfg); err != nil {
			fail(err)
		}
	}
	rep, err := run(ctx, cfg, os.Stderr)
	if c != nil {
		if cerr := c.Close(); cerr != nil {
			fmt.Fprintln(os.Stderr, "bench: stopping the cluster:", cerr)
		}
	}
	if rep != nil {
		rep.command = commandLine()
		fmt.Println()
		fmt.Print(rep.text())
		if *out != "" {
			if werr := rep.writeMarkdown(*out); werr != nil {
				fmt.Fprintln(os.Stderr, "bench: writing", *out+":", werr)
			} else {
				fmt.Fprintln(os.Stderr, "bench: wrote", *out)
			}
		}
	}
	if err != nil {
		pprof.StopCPUProfile()
		fail(err)
	}
}

// needsPostgres reports whether cfg names a part that runs on PostgreSQL.
func needsPostgres(cfg config) bool {
	for _, p := range []string{"enqueue", "drain", "latency", "fairness", "backlog", "recover", "secrets"} {
		if cfg.has(p) {
			return true
		}
	}
	return false
}

// startCluster starts a throwaway PostgreSQL cluster with production
// settings (autovacuum on; txhook's per-table settings come with its
// migrations), creates the database bench on it and points cfg at it.
func startCluster(ctx context.Context, cfg *config) (*pgcluster.Cluster, error) {
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: pgcluster.Production()})
	if err != nil {
		return nil, fmt.Errorf("starting a PostgreSQL cluster (-cluster=false and %s to use a server of your own): %w", EnvDSN, err)
	}
	if err := c.CreateDatabase(ctx, "bench"); err != nil {
		c.Close()
		return nil, err
	}
	if cfg.Settings, err = c.ShowSettings(ctx); err != nil {
		c.Close()
		return nil, err
	}
	cfg.DSN = c.DSN("bench")
	// pg_walinspect (contrib, shipped with the server) breaks the WAL the
	// drain measures down by record type; without it the totals remain.
	if db, err := sql.Open("pgx", cfg.DSN); err == nil {
		_, _ = db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
		db.Close()
	}
	return c, nil
}

// run runs the parts cfg names and returns what they measured. On an error
// the report holds the parts that finished.
func run(ctx context.Context, cfg config, progress io.Writer) (*report, error) {
	p := newProgress(progress)
	rep := newReport(ctx, cfg)
	if cfg.DSN == "" && needsPostgres(cfg) {
		rep.note("PostgreSQL parts skipped: %s is not set (or -cluster found no PostgreSQL binaries).", EnvDSN)
	}
	if len(cfg.Settings) > 0 {
		var b strings.Builder
		for _, s := range cfg.Settings {
			fmt.Fprintf(&b, "%s = %s\n", s.Name, s.Value)
		}
		rep.section("PostgreSQL settings (a cluster of the bench's own, internal/pgcluster Production(); per-table settings from the migrations)", b.String())
	}
	rcv, err := startReceiver()
	if err != nil {
		return rep, err
	}
	defer rcv.close()
	pg := cfg.DSN != ""
	steps := []struct {
		part string
		pg   bool
		fn   func() error
	}{
		{"enqueue", true, func() error { return partEnqueue(ctx, cfg, rep, p) }},
		{"drain", true, func() error { return partDrain(ctx, cfg, rep, p, rcv) }},
		{"latency", true, func() error { return partLatency(ctx, cfg, rep, p, rcv) }},
		{"fairness", true, func() error { return partFairness(ctx, cfg, rep, p, rcv) }},
		{"backlog", true, func() error { return partBacklog(ctx, cfg, rep, p, rcv) }},
		{"recover", true, func() error { return partRecover(ctx, cfg, rep, p) }},
		{"partition", false, func() error { return partPartition(ctx, cfg, rep, p) }},
		{"sqlite", false, func() error { return partSQLite(ctx, cfg, rep, p, rcv) }},
		{"secrets", false, func() error { return partSecrets(ctx, cfg, rep, p, rcv) }},
		{"signer", false, func() error { return partSigner(cfg, rep, p) }},
		// Its own cluster: no DSN needed.
		{"relays", false, func() error { return partRelays(ctx, cfg, rep, p, rcv) }},
		// Its own clusters and nats-server.
		{"broker", false, func() error { return partBroker(ctx, cfg, rep, p, rcv) }},
	}
	for _, s := range steps {
		if !cfg.has(s.part) || (s.pg && !pg) {
			continue
		}
		p.logf("== %s", s.part)
		start := time.Now()
		if err := s.fn(); err != nil {
			return rep, fmt.Errorf("%s: %w", s.part, err)
		}
		p.logf("== %s done in %s", s.part, time.Since(start).Round(100*time.Millisecond))
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func commandLine() string {
	args := []string{"go run ./examples/bench"}
	skip := false
	for _, a := range os.Args[1:] {
		// -revision only names what was measured.
		if skip || strings.HasPrefix(strings.TrimLeft(a, "-"), "revision") {
			skip = !skip && !strings.Contains(a, "=")
			continue
		}
		if strings.ContainsAny(a, " '\"$") {
			a = strconv.Quote(a)
		}
		args = append(args, a)
	}
	dsn := os.Getenv(EnvDSN)
	if !strings.Contains(strings.Join(os.Args, " "), "-cluster=false") {
		dsn = ""
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		dsn = u.Redacted()
	}
	if dsn == "" {
		return strings.Join(args, " ")
	}
	return EnvDSN + "='" + dsn + "' " + strings.Join(args, " ")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
