package store

import (
	"context"
	"encoding/json"
)

// EndpointSecrets is an endpoint's ID and its columns that are stored
// encrypted when the outbox has a Cipher (outbox/secrets.go).
type EndpointSecrets struct {
	ID        string
	Secrets   []byte
	ClientKey []byte // empty for no client certificate
	Headers   []byte // custom request headers; "{}" for none
}

// SecretsPage reads up to limit endpoints' secrets, client keys and headers in ID
// order, starting after the ID after, without locking them.
func (s *Store) SecretsPage(ctx context.Context, after string, limit int) ([]EndpointSecrets, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT `+secretCols+` FROM txhook_endpoints WHERE id > ? ORDER BY id LIMIT ?`), after, limit)
	if err != nil {
		return nil, err
	}
	return scanSecrets(rows)
}

// secretCols are the columns scanSecrets reads.
const secretCols = `id, secrets, client_key, headers`

func scanSecrets(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close() error
}) ([]EndpointSecrets, error) {
	defer rows.Close()
	var out []EndpointSecrets
	for rows.Next() {
		var id, secrets, key, headers string
		if err := rows.Scan(&id, &secrets, &key, &headers); err != nil {
			return nil, err
		}
		out = append(out, EndpointSecrets{ID: id, Secrets: []byte(secrets), ClientKey: []byte(key), Headers: []byte(headers)})
	}
	return out, rows.Err()
}

// SecretKeySamples returns, for each key ID found in an encrypted secrets
// column (a JSON object with a "kid" member), the endpoint with the
// lowest ID stored under it, and the same for each key ID in an encrypted
// client_key column (text starting with '{') and in an encrypted headers
// column (a JSON object whose member "v" is a number), with their
// secrets, client keys and headers: enough to check at start-up that every
// key in use is known and right, without reading every row.
func (s *Store) SecretKeySamples(ctx context.Context) ([]EndpointSecrets, error) {
	q := `SELECT MIN(id) FROM txhook_endpoints WHERE json_type(secrets) = 'object' GROUP BY json_extract(secrets, '$.kid')
UNION SELECT MIN(id) FROM txhook_endpoints WHERE substr(client_key, 1, 1) = '{' GROUP BY json_extract(client_key, '$.kid')
UNION SELECT MIN(id) FROM txhook_endpoints WHERE json_type(headers, '$.v') IN ('integer', 'real') GROUP BY json_extract(headers, '$.kid')`
	if s.Dialect == Postgres {
		q = `SELECT MIN(id) FROM txhook_endpoints WHERE jsonb_typeof(secrets) = 'object' GROUP BY secrets->>'kid'
UNION SELECT MIN(id) FROM txhook_endpoints WHERE substr(client_key, 1, 1) = '{' GROUP BY client_key::jsonb->>'kid'
UNION SELECT MIN(id) FROM txhook_endpoints WHERE jsonb_typeof(headers->'v') = 'number' GROUP BY headers->>'kid'`
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(q))
	if err != nil {
		return nil, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return nil, err
	}
	list, _ := json.Marshal(ids)
	rows, err = s.DB.QueryContext(ctx, s.Rebind(`SELECT `+secretCols+` FROM txhook_endpoints WHERE `+s.textIDsIn("id")+` ORDER BY id`), string(list))
	if err != nil {
		return nil, err
	}
	return scanSecrets(rows)
}

// textIDsIn renders "col IN (…)" over a JSON array of strings parameter.
func (s *Store) textIDsIn(col string) string {
	if s.Dialect == Postgres {
		return col + ` IN (SELECT jsonb_array_elements_text(?::jsonb))`
	}
	return col + ` IN (SELECT value FROM json_each(?))`
}

// RewriteSecrets rewrites the secrets, client keys and headers of the
// endpoints ids in one transaction: fn gets each row's current values and
// returns the new ones, a nil Secrets, ClientKey or Headers leaving that
// column alone. On PostgreSQL the rows are locked (FOR
// UPDATE SKIP LOCKED), so a concurrent ModifySecrets never loses its
// write, and rows another transaction holds are skipped rather than
// waited for, so this never takes part in a deadlock: it returns the IDs
// of the rows that exist but were skipped, for the caller to try again
// later. On SQLite the transaction holds the database's write lock and
// skips nothing. updated_at is left alone: the endpoint does not change,
// only how its secrets are stored.
func (s *Store) RewriteSecrets(ctx context.Context, ids []string, fn func(current EndpointSecrets) (EndpointSecrets, error)) (skipped []string, err error) {
	list, _ := json.Marshal(ids)
	where := ` FROM txhook_endpoints WHERE ` + s.textIDsIn("id") + ` ORDER BY id`
	err = s.Tx(ctx, func(q Querier) error {
		skipped = nil
		var exist map[string]bool
		lock := ""
		if s.Dialect == Postgres {
			lock = " FOR UPDATE SKIP LOCKED"
			rows, err := q.QueryContext(ctx, s.Rebind(`SELECT id, '', '', ''`+where), string(list))
			if err != nil {
				return err
			}
			all, err := scanSecrets(rows)
			if err != nil {
				return err
			}
			exist = make(map[string]bool, len(all))
			for _, e := range all {
				exist[e.ID] = true
			}
		}
		rows, err := q.QueryContext(ctx, s.Rebind(`SELECT `+secretCols+where+lock), string(list))
		if err != nil {
			return err
		}
		cur, err := scanSecrets(rows)
		if err != nil {
			return err
		}
		for _, c := range cur {
			delete(exist, c.ID)
			next, err := fn(c)
			if err != nil {
				return err
			}
			for _, col := range []struct {
				name string
				v    []byte
			}{{"secrets", next.Secrets}, {"client_key", next.ClientKey}, {"headers", next.Headers}} {
				if col.v == nil {
					continue
				}
				if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET `+col.name+` = ? WHERE id = ?`), string(col.v), c.ID); err != nil {
					return err
				}
			}
		}
		for id := range exist {
			skipped = append(skipped, id)
		}
		return nil
	})
	return skipped, err
}
