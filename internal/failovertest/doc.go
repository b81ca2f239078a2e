// Package failovertest holds txhook's failover tests: a primary and a
// synchronous streaming replica started by internal/pgcluster, relays and
// enqueuers on a multi-host DSN, the primary killed or frozen mid-delivery
// and the replica promoted. They live apart from package outbox's tests
// so that package stays within go test's default timeout on a busy
// machine. See docs/SCALING.md, Failover.
package failovertest
