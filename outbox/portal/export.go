package portal

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/txhook/txhook/outbox"
)

// exportColumns are the CSV header, and the JSON fields, of an export.
var exportColumns = []string{"event_id", "event_type", "created_at", "endpoint_id", "state", "attempts", "last_status", "delivered_at"}

// exportJSON is one line of a JSON export.
type exportJSON struct {
	EventID     string     `json:"event_id"`
	EventType   string     `json:"event_type"`
	CreatedAt   time.Time  `json:"created_at"`
	EndpointID  string     `json:"endpoint_id"`
	State       string     `json:"state"`
	Attempts    int        `json:"attempts"`
	LastStatus  int        `json:"last_status"`
	DeliveredAt *time.Time `json:"delivered_at"`
}

// cell makes a CSV cell safe to open in a spreadsheet: one that starts
// with = + - @ (or a tab or carriage return) would be read as a formula,
// so it gets a leading apostrophe.
func cell(s string) string {
	if s != "" {
		switch s[0] {
		case '=', '+', '-', '@', '\t', '\r':
			return "'" + s
		}
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// export streams the tenant's events and their final delivery outcome in a
// time range as CSV (format=csv, the default) or one JSON array
// (format=json), row by row as the database returns them.
func (p *Portal) export(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	f, format, ok := p.exportFilter(r.URL.Query(), "csv")
	if !ok {
		p.fail(w, r, st.tenant, http.StatusBadRequest, "err.filter")
		return
	}
	p.writeExport(w, r, f, format, func(err error) {
		p.internal(w, r, err)
	})
}

// DefaultExportSpan is how far back an export without a start goes.
const DefaultExportSpan = 31 * 24 * time.Hour

// exportFilter reads an export's query: since (default DefaultExportSpan
// ago), until, endpoint, type, and format (csv or json, default def).
func (p *Portal) exportFilter(q url.Values, def string) (outbox.ExportFilter, string, bool) {
	f := outbox.ExportFilter{EndpointID: q.Get("endpoint"), EventType: q.Get("type")}
	var ok1, ok2 bool
	f.Since, ok1 = parseTime(q.Get("since"))
	f.Until, ok2 = parseTime(q.Get("until"))
	if f.Since.IsZero() {
		f.Since = p.now().Add(-DefaultExportSpan)
	}
	format := q.Get("format")
	if format == "" {
		format = def
	}
	return f, format, ok1 && ok2 && (format == "csv" || format == "json") && (f.Until.IsZero() || f.Since.Before(f.Until))
}

// writeExport streams an export; onEarlyErr answers when nothing was
// written yet. An error after that (the database's, or a failed write to
// the client) is logged and aborts the response with http.ErrAbortHandler:
// the status line and part of the body are gone, and a body that ended
// cleanly would pass for a complete export missing its last rows.
func (p *Portal) writeExport(w http.ResponseWriter, r *http.Request, f outbox.ExportFilter, format string, onEarlyErr func(error)) {
	st := state(r)
	name := "webhooks-" + p.now().Format("20060102-150405") + "." + format
	started := false
	// Every write goes through bw, whose first error sticks: csv.Writer
	// writes into it directly (its own buffer would be bw itself) and
	// json.Encoder per row, and the last Flush reports what failed since.
	bw := bufio.NewWriterSize(w, 32<<10)
	start := func() {
		if started {
			return
		}
		started = true
		h := w.Header()
		if format == "csv" {
			h.Set("Content-Type", "text/csv; charset=utf-8")
		} else {
			h.Set("Content-Type", "application/json")
		}
		h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
		w.WriteHeader(http.StatusOK)
	}
	var err error
	n := 0
	if format == "csv" {
		cw := csv.NewWriter(bw)
		err = st.view.Export(r.Context(), f, func(row outbox.ExportRow) error {
			start()
			if n == 0 {
				if err := cw.Write(exportColumns); err != nil {
					return err
				}
			}
			n++
			return cw.Write([]string{cell(row.EventID), cell(row.EventType), stamp(row.CreatedAt), cell(row.EndpointID), cell(row.State),
				strconv.Itoa(row.Attempts), strconv.Itoa(row.LastStatus), stamp(row.DeliveredAt)})
		})
		if err == nil {
			start()
			if n == 0 {
				err = cw.Write(exportColumns)
			}
			if err == nil {
				cw.Flush()
				err = cw.Error()
			}
		}
	} else {
		enc := json.NewEncoder(bw)
		err = st.view.Export(r.Context(), f, func(row outbox.ExportRow) error {
			start()
			sep := ",\n"
			if n == 0 {
				sep = "[\n"
			}
			n++
			if _, err := bw.WriteString(sep); err != nil {
				return err
			}
			j := exportJSON{EventID: row.EventID, EventType: row.EventType, CreatedAt: row.CreatedAt.UTC(), EndpointID: row.EndpointID,
				State: row.State, Attempts: row.Attempts, LastStatus: row.LastStatus}
			if !row.DeliveredAt.IsZero() {
				t := row.DeliveredAt.UTC()
				j.DeliveredAt = &t
			}
			return enc.Encode(j)
		})
		if err == nil {
			start()
			if n == 0 {
				_, err = bw.WriteString("[")
			}
			if err == nil {
				_, err = bw.WriteString("]\n")
			}
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		return
	}
	if !started {
		onEarlyErr(err)
		return
	}
	level := slog.LevelError
	if r.Context().Err() != nil {
		level = slog.LevelWarn // the client went away
	}
	p.log.Log(r.Context(), level, "txhook: portal export cut short", "tenant", st.tenant, "format", format, "rows", n, "error", err)
	panic(http.ErrAbortHandler)
}
