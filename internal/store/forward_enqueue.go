package store

import "strings"

// Broker mode (package outbox/broker) on PostgreSQL: an event is written
// with dispatched_at set, so that it never enters the partial indexes of
// undispatched events that table-mode relays claim from, and with
// forward_xid, the ID of the transaction that writes it, by which
// forwarders find it (see forward.go). dispatched_at is the transaction's
// start (now()): the event is handed to the forwarders as it commits.
//
// The statements are Enqueue's own with the two columns added, made once
// from them, so both modes write the same row otherwise. On SQLite broker
// mode writes events as table mode does: its forwarder claims them.

// forwardInsert returns q, an INSERT INTO txhook_events with one VALUES
// tuple or a head ending in "VALUES " (valuesOnly false), or a tuple of
// placeholders (valuesOnly true), with dispatched_at and forward_xid
// added.
func forwardInsert(q string, tuple bool) string {
	const cols = ", dispatched_at, forward_xid"
	const vals = ", now(), pg_current_xact_id()"
	if tuple {
		return strings.TrimSuffix(q, ")") + vals + ")"
	}
	head := "INSERT INTO txhook_events ("
	i := strings.Index(q, head)
	if i < 0 {
		panic("store: forwardInsert: not an insert into txhook_events: " + q)
	}
	end := i + len(head) + strings.IndexByte(q[i+len(head):], ')')
	q = q[:end] + cols + q[end:]
	v := strings.Index(q, "VALUES (")
	if v < 0 {
		return q // a head: its tuples are rewritten apart
	}
	close := v + strings.IndexByte(q[v:], ')')
	return q[:close] + vals + q[close:]
}

// The broker-mode variants of the enqueue statements.
var (
	pgForwardEnqueue             = forwardInsert(pgEnqueue, false)
	pgForwardEnqueueNotify       = forwardInsert(pgEnqueueNotify, false)
	pgForwardEnqueueTraced       = forwardInsert(pgEnqueueTraced, false)
	pgForwardEnqueueNotifyTraced = forwardInsert(pgEnqueueNotifyTraced, false)
	forwardEventsHead            = forwardInsert(insertEventsHead, false)
	forwardEventsRow             = forwardInsert(insertEventsRow, true)
)

// forwarding reports whether events are written for forwarders: broker
// mode on PostgreSQL.
func (s *Store) forwarding() bool { return s.Forward && s.Dialect == Postgres }

// enqueueSQL returns the statement that writes one event.
func (s *Store) enqueueSQL(traced, notify bool) string {
	if s.Dialect != Postgres {
		if traced {
			return sqliteEnqueueTraced
		}
		return sqliteEnqueue
	}
	switch f := s.forwarding(); {
	case traced && notify && f:
		return pgForwardEnqueueNotifyTraced
	case traced && notify:
		return pgEnqueueNotifyTraced
	case traced && f:
		return pgForwardEnqueueTraced
	case traced:
		return pgEnqueueTraced
	case notify && f:
		return pgForwardEnqueueNotify
	case notify:
		return pgEnqueueNotify
	case f:
		return pgForwardEnqueue
	}
	return pgEnqueue
}
