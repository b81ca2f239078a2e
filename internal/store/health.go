package store

import (
	"context"
	"database/sql"
	"math"
	"sort"
	"time"
)

// Bounds of the health queries: besides index-only counts, each reads at
// most this many attempt rows of an endpoint, whatever the traffic.
const (
	// HealthLatencySample is how many of the latest attempts in the window
	// the latency percentiles are computed over.
	HealthLatencySample = 10000
	// HealthRecent is how many of the latest attempts the run of failures
	// and the last success are looked for in.
	HealthRecent = 1000
)

// unfinishedStates are the states of deliveries that count as backlog:
// waiting, in flight, or held while their endpoint is disabled.
const unfinishedStates = `'pending', 'running', 'paused', 'blocked'`

// HealthStats are one endpoint's numbers over a window [since, until).
type HealthStats struct {
	Attempts int // attempts started in the window
	Failed   int // of those, failed (every failed attempt records an error)

	// Latency percentiles in microseconds, over up to HealthLatencySample
	// of the latest attempts in the window that made a request (duration
	// above zero); valid when LatencyN > 0.
	P50, P95 float64
	LatencyN int

	// Streak is the number of failed attempts since the last success,
	// among the latest HealthRecent attempts.
	Streak      int
	LastSuccess *AttemptRow // nil: none among the latest HealthRecent attempts
	LastFailure *AttemptRow // nil: never failed

	Backlog      int       // deliveries pending, running or paused
	DeadLetters  int       // dead letters not replayed or purged
	FailingSince time.Time // the relays' record of the current run of failures; zero when none
}

// EndpointHealth computes an endpoint's health numbers. Every query walks
// an index of the endpoint: the counts are index-only scans of the window,
// and the other rows read are bounded by HealthLatencySample and
// HealthRecent.
func (s *Store) EndpointHealth(ctx context.Context, endpointID string, since, until time.Time) (HealthStats, error) {
	var h HealthStats
	var failing Time
	// Failures are counted on the partial index of failed attempts, so
	// both counts are index-only, however busy the endpoint.
	args := append(s.countAttemptsArgs(endpointID, since, until),
		endpointID, s.T(since), s.T(until),
		endpointID, endpointID, endpointID)
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT
    `+countAttempts+`,
    (SELECT count(*) FROM txhook_attempts WHERE endpoint_id = ? AND started_at >= ? AND started_at < ? AND error <> ''),
    (SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state IN (`+unfinishedStates+`)),
    (SELECT count(*) FROM txhook_dead_letters WHERE endpoint_id = ?),
    (SELECT failing_since FROM txhook_endpoints WHERE id = ?)`), args...).Scan(&h.Attempts, &h.Failed, &h.Backlog, &h.DeadLetters, &failing)
	if err != nil {
		return HealthStats{}, err
	}
	h.FailingSince = failing.Time

	if err := s.latency(ctx, &h, endpointID, since, until); err != nil {
		return HealthStats{}, err
	}

	// The run of failures: the rank of the newest success among the latest
	// attempts, or all of them when none succeeded.
	var n int
	var firstOK sql.NullInt64
	err = s.DB.QueryRowContext(ctx, s.Rebind(`SELECT count(*), min(CASE WHEN ok = 1 THEN rn END) FROM (
    SELECT CASE WHEN error = '' THEN 1 ELSE 0 END AS ok,
           ROW_NUMBER() OVER (ORDER BY started_at DESC, id DESC) AS rn
    FROM (SELECT started_at, id, error FROM (`+recentAttempts("", "")+`) r
          ORDER BY started_at DESC, id DESC LIMIT ?) latest
) ranked`), endpointID, HealthRecent, endpointID, HealthRecent, HealthRecent).Scan(&n, &firstOK)
	if err != nil {
		return HealthStats{}, err
	}
	h.Streak = n
	if firstOK.Valid {
		h.Streak = int(firstOK.Int64) - 1
	}

	if h.LastSuccess, err = s.oneAttempt(ctx, `SELECT delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error
FROM (SELECT * FROM (`+recentAttempts("", "")+`) r ORDER BY started_at DESC, id DESC LIMIT ?) latest
WHERE error = '' ORDER BY started_at DESC, id DESC LIMIT 1`, endpointID, HealthRecent, endpointID, HealthRecent, HealthRecent); err != nil {
		return HealthStats{}, err
	}
	// The partial index of failed attempts makes this one index probe.
	if h.LastFailure, err = s.oneAttempt(ctx, `SELECT delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error
FROM txhook_attempts WHERE endpoint_id = ? AND error <> '' ORDER BY started_at DESC, id DESC LIMIT 1`, endpointID); err != nil {
		return HealthStats{}, err
	}
	return h, nil
}

// recentAttempts is the attempt log of one endpoint (the first
// placeholder), latest first, at most the second placeholder's number of
// rows from each of its two parts: the rows of txhook_attempts (with
// extraRows added to their condition) and the first attempts kept in
// their deliveries' rows (extraInline), with the view txhook_attempt_log's
// columns. Each part walks its own index backwards and stops at the
// limit, which a query of the view cannot do; the caller orders the union
// and takes its own limit. extraRows' and extraInline's placeholders come
// after the endpoint's in each part.
func recentAttempts(extraRows, extraInline string) string {
	return `SELECT * FROM (
    SELECT delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error, id
    FROM txhook_attempts WHERE endpoint_id = ? ` + extraRows + `
    ORDER BY started_at DESC, id DESC LIMIT ?) ra
UNION ALL
SELECT * FROM (
    SELECT id AS delivery_id, endpoint_id, 1 AS attempt, ok_started_at AS started_at, ok_duration_us AS duration_us,
           last_status AS status, COALESCE(ok_excerpt, '') AS response_excerpt, '' AS error, 0 AS id
    FROM txhook_deliveries WHERE endpoint_id = ? AND ok_started_at IS NOT NULL ` + extraInline + `
    ORDER BY created_at DESC, id DESC LIMIT ?) rd`
}

// The first attempts kept in delivery rows are read through the
// endpoint's deliveries by created_at (txhook_deliveries_endpoint_log),
// within InlineSlack of their start: inlineWindow is the condition on a
// delivery row that its inline attempt started in [?, ?), and
// inlineWindowArgs its arguments.
const inlineWindow = `AND created_at >= ? AND created_at < ? AND ok_started_at >= ? AND ok_started_at < ?`

func (s *Store) inlineWindowArgs(since, until time.Time) []any {
	return []any{s.T(since.Add(-InlineSlack)), s.T(until.Add(InlineSlack)), s.T(since), s.T(until)}
}

// countAttempts is the number of attempts of endpoint ? started in [?, ?),
// from both parts of the attempt log, each through its endpoint's index.
const countAttempts = `(SELECT count(*) FROM txhook_attempts WHERE endpoint_id = ? AND started_at >= ? AND started_at < ?) +
    (SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND ok_started_at IS NOT NULL ` + inlineWindow + `)`

func (s *Store) countAttemptsArgs(endpointID string, since, until time.Time) []any {
	return append([]any{endpointID, s.T(since), s.T(until), endpointID}, s.inlineWindowArgs(since, until)...)
}

func (s *Store) oneAttempt(ctx context.Context, query string, args ...any) (*AttemptRow, error) {
	a, err := scanAttempt(s.DB.QueryRowContext(ctx, s.Rebind(query), args...))
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// latency fills the percentiles: percentile_cont on PostgreSQL; SQLite has
// no percentile function, so the (bounded) sample is sorted here and
// interpolated the same way.
func (s *Store) latency(ctx context.Context, h *HealthStats, endpointID string, since, until time.Time) error {
	sample := `SELECT duration_us FROM (` + recentAttempts(
		`AND started_at >= ? AND started_at < ? AND duration_us > 0`,
		inlineWindow+` AND ok_duration_us > 0`) + `) r
ORDER BY started_at DESC LIMIT ?`
	args := []any{endpointID, s.T(since), s.T(until), HealthLatencySample, endpointID}
	args = append(append(args, s.inlineWindowArgs(since, until)...), HealthLatencySample, HealthLatencySample)
	if s.Dialect == Postgres {
		var p50, p95 sql.NullFloat64
		err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT count(*),
    percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_us),
    percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_us)
FROM (`+sample+`) s`), args...).Scan(&h.LatencyN, &p50, &p95)
		h.P50, h.P95 = p50.Float64, p95.Float64
		return err
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(sample), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var us []float64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return err
		}
		us = append(us, float64(v))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	sort.Float64s(us)
	h.LatencyN = len(us)
	h.P50, h.P95 = Percentile(us, 0.5), Percentile(us, 0.95)
	return nil
}

// Percentile interpolates the p-th percentile (0 ≤ p ≤ 1) of sorted values
// linearly between the closest ranks, as PostgreSQL's percentile_cont does.
// It returns 0 for no values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := p * float64(len(sorted)-1)
	lo := math.Floor(rank)
	hi := math.Ceil(rank)
	a, b := sorted[int(lo)], sorted[int(hi)]
	return a + (rank-lo)*(b-a)
}

// BacklogCount is the number of deliveries of one endpoint in one state.
type BacklogCount struct {
	EndpointID string
	State      string
	N          int
}

// Backlog counts the deliveries waiting or in flight, per endpoint and
// unfinished state. It reads the (endpoint_id, state) index.
func (s *Store) Backlog(ctx context.Context) ([]BacklogCount, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT endpoint_id, state, count(*) FROM txhook_deliveries
WHERE state IN (`+unfinishedStates+`) GROUP BY endpoint_id, state`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []BacklogCount
	for rows.Next() {
		var b BacklogCount
		if err := rows.Scan(&b.EndpointID, &b.State, &b.N); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// Undispatched counts the committed events no relay has fanned out yet,
// on the two partial indexes of undispatched events.
func (s *Store) Undispatched(ctx context.Context) (int, error) {
	var n int
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT
    (SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL AND ordering_key IS NULL) +
    (SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL AND ordering_key IS NOT NULL)`)).Scan(&n)
	return n, err
}

// DeadLettersByEndpoint counts the dead letters of each endpoint.
func (s *Store) DeadLettersByEndpoint(ctx context.Context) (map[string]int, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT endpoint_id, count(*) FROM txhook_dead_letters GROUP BY endpoint_id`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// RefusedDeadLettersByEndpoint counts, per endpoint, the dead letters of
// reason DeadReasonRefused: one grouped count on their partial index
// (txhook_dead_letters_refused, migration 010).
func (s *Store) RefusedDeadLettersByEndpoint(ctx context.Context) (map[string]int, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT endpoint_id, count(*) FROM txhook_dead_letters WHERE reason = '`+DeadReasonRefused+`' GROUP BY endpoint_id`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}
