package store

import (
	"context"
	"sync/atomic"
	"time"
)

// AuditRow is a row of txhook_audit.
type AuditRow struct {
	ID                  int64
	At                  time.Time
	Tenant, Actor, Addr string
	Action, Target      string
	Detail              []byte // JSON object; "{}" when nil
}

// InsertAudit writes one audit row with q (a transaction, to record it
// with the change it describes).
func (s *Store) InsertAudit(ctx context.Context, q Querier, a AuditRow) error {
	detail := string(a.Detail)
	if detail == "" {
		detail = "{}"
	}
	_, err := q.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_audit (at, tenant, actor, addr, action, target, detail) VALUES (?, ?, ?, ?, ?, ?, ?)`),
		s.T(a.At), a.Tenant, a.Actor, a.Addr, a.Action, a.Target, detail)
	return NotMigrated(err)
}

// AuditCursor is a position in the audit log, newest first.
type AuditCursor struct {
	At time.Time
	ID int64
}

// AuditFilter selects audit rows. AllTenants lists every tenant's rows
// (operators); otherwise only Tenant's.
type AuditFilter struct {
	AllTenants   bool
	Tenant       string
	Action       string
	Since, Until time.Time
}

// ListAudit returns up to limit audit rows matching f, newest first, after
// cursor when it is not nil.
func (s *Store) ListAudit(ctx context.Context, f AuditFilter, after *AuditCursor, limit int) ([]AuditRow, error) {
	where, args := "1 = 1", []any{}
	if !f.AllTenants {
		where, args = where+" AND tenant = ?", append(args, f.Tenant)
	}
	if f.Action != "" {
		where, args = where+" AND action = ?", append(args, f.Action)
	}
	if !f.Since.IsZero() {
		where, args = where+" AND at >= ?", append(args, s.T(f.Since))
	}
	if !f.Until.IsZero() {
		where, args = where+" AND at < ?", append(args, s.T(f.Until))
	}
	if after != nil {
		where += " AND (at < ? OR (at = ? AND id < ?))"
		args = append(args, s.T(after.At), s.T(after.At), after.ID)
	}
	args = append(args, limit)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT id, at, tenant, actor, addr, action, target, detail FROM txhook_audit
WHERE `+where+` ORDER BY at DESC, id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, NotMigrated(err)
	}
	defer rows.Close()
	var out []AuditRow
	for rows.Next() {
		var a AuditRow
		var at Time
		var detail string
		if err := rows.Scan(&a.ID, &at, &a.Tenant, &a.Actor, &a.Addr, &a.Action, &a.Target, &detail); err != nil {
			return nil, err
		}
		a.At, a.Detail = at.Time, []byte(detail)
		out = append(out, a)
	}
	return out, rows.Err()
}

// PruneAudit deletes up to limit audit rows older than before.
func (s *Store) PruneAudit(ctx context.Context, before time.Time, limit int) (int, error) {
	res, err := s.DB.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_audit WHERE id IN (
    SELECT id FROM txhook_audit WHERE at < ? ORDER BY at LIMIT ?)`), s.T(before), limit)
	if err != nil {
		return 0, NotMigrated(err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// pendingAudit is an audit row waiting for the transaction of its change.
type pendingAudit struct {
	row     AuditRow
	written atomic.Bool
}

type auditKey struct{}

// WithAudit returns ctx carrying a: the first transaction run by Tx in
// that ctx writes a before it commits, so the change and its audit row
// commit together. written reports whether that happened (false when no
// transaction committed in ctx: the caller then writes a itself).
func WithAudit(ctx context.Context, a AuditRow) (_ context.Context, written func() bool) {
	p := &pendingAudit{row: a}
	return context.WithValue(ctx, auditKey{}, p), p.written.Load
}

// auditInTx writes ctx's pending audit row with q unless an earlier
// transaction did; committed marks it written once the transaction
// committed.
func (s *Store) auditInTx(ctx context.Context, q Querier) (committed func(), err error) {
	p, _ := ctx.Value(auditKey{}).(*pendingAudit)
	if p == nil || p.written.Load() {
		return func() {}, nil
	}
	if err := s.InsertAudit(ctx, q, p.row); err != nil {
		return nil, err
	}
	return func() { p.written.Store(true) }, nil
}
