package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
)

// ErrPoolerUnsafe: Config.TransactionPooling is set, and the driver's
// settings let a transaction-mode pooler split one statement across two
// server connections.
var ErrPoolerUnsafe = errors.New("txhook: the driver's settings are unsafe behind a pooler in transaction mode")

// CheckPooler checks that the driver of s.DB sends each statement in one
// piece, as a pooler in transaction mode (PgBouncer pool_mode =
// transaction) needs: it may hand each server transaction to another
// server connection, so a statement prepared in one and executed in the
// next runs on a connection that lacks it or, worse, holds another
// client's statement of the same name, which then runs with these
// parameters. Both drivers do that by default. Drivers it does not know
// pass unchecked.
func (s *Store) CheckPooler(ctx context.Context) error {
	if s.Dialect != Postgres {
		return nil
	}
	switch fmt.Sprintf("%T", s.DB.Driver()) {
	case "*pq.Driver":
		return s.checkLibPQ(ctx)
	case "*stdlib.Driver":
		return s.checkPgx(ctx)
	}
	return nil
}

// checkLibPQ tells lib/pq's binary_parameters mode, which sends a
// statement, its parameters and its execution in one message batch, by
// its effect: it sends []byte parameters in binary, so four bytes make an
// int4; otherwise it prepares the unnamed statement first, in a server
// transaction of its own, and sends the bytes as text. The probe runs in a
// transaction, which a pooler keeps on one server connection.
func (s *Store) checkLibPQ(ctx context.Context) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	err = tx.QueryRowContext(ctx, "SELECT $1::int4", []byte{0, 0, 0, 7}).Scan(&n)
	var pe interface{ SQLState() string }
	switch {
	case err == nil && n == 7:
		return nil
	case err == nil || errors.As(err, &pe) && (pe.SQLState() == "22021" || pe.SQLState() == "22P02"):
		return fmt.Errorf("%w: lib/pq prepares each statement in a server transaction of its own unless the DSN has binary_parameters=yes", ErrPoolerUnsafe)
	}
	return err
}

// checkPgx reads the default query exec mode of the pgx connection
// behind database/sql; cache_statement (pgx's default) names prepared
// statements, describe_exec prepares the unnamed one in a server
// transaction of its own.
func (s *Store) checkPgx(ctx context.Context) error {
	c, err := s.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var mode string
	if err := c.Raw(func(dc any) error { mode = pgxExecMode(dc); return nil }); err != nil {
		return err
	}
	if mode == "cache statement" || mode == "describe exec" {
		return fmt.Errorf("%w: pgx's query exec mode is %q; set default_query_exec_mode=cache_describe (or exec, or simple_protocol) in the DSN, or ConnConfig.DefaultQueryExecMode", ErrPoolerUnsafe, mode)
	}
	return nil
}

// pgxExecMode returns dc.Conn().Config().DefaultQueryExecMode.String() of
// a *stdlib.Conn, found by reflection as package store imports no driver;
// "" when dc does not have that shape.
func pgxExecMode(dc any) (mode string) {
	defer func() {
		if recover() != nil {
			mode = ""
		}
	}()
	conn := reflect.ValueOf(dc).MethodByName("Conn").Call(nil)[0]
	cfg := conn.MethodByName("Config").Call(nil)[0].Elem()
	m := cfg.FieldByName("DefaultQueryExecMode")
	return m.MethodByName("String").Call(nil)[0].String()
}
