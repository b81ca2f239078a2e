package broker

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/queue"
)

// The stream's subjects, under the prefix P (Config.Subjects):
//
//	P.q.<key>         a delivery waiting for a worker (the consumer's filter)
//	P.s.<key>         a delivery's next attempt, scheduled (JetStream message
//	                  schedules: fired onto P.q.<key> at its time)
//	P.rejected        messages found on P.q that no forwarder published,
//	                  kept with the reason, never delivered
//
// A delivery's key is e.<event ID>.<endpoint ID> for a delivery of a new
// event, r.<row ID> for one a forwarder took from a delivery row (a
// replay, a resend, a recovery): one subject per delivery, so it has at
// most one scheduled attempt, and a forwarder can tell whether the stream
// still holds it.

// Headers.
const (
	headerMsgID = "Nats-Msg-Id"
	headerMAC   = "Txhook-Mac"
	// headerReason says why a message was rejected.
	headerReason = "Txhook-Rejected"
	// The message schedule headers of nats-server 2.12 and later.
	headerSchedule       = "Nats-Schedule"
	headerScheduleTarget = "Nats-Schedule-Target"
)

// body is a delivery message as it travels: the delivery and the event,
// whose payload is the caller's JSON as Enqueue stored it.
type body struct {
	V            int             `json:"v"`
	Key          string          `json:"k"`
	Row          int64           `json:"r,omitempty"`
	Base         int             `json:"b"`
	Attempt      int             `json:"a"`
	Lapsed       bool            `json:"l,omitempty"`
	RefusedSince int64           `json:"rs,omitempty"` // Unix µs
	EndpointID   string          `json:"ep"`
	Event        eventBody       `json:"e"`
	Payload      json.RawMessage `json:"p"`
}

type eventBody struct {
	ID          string `json:"id"`
	Tenant      string `json:"t"`
	Type        string `json:"ty"`
	Version     int    `json:"v"`
	CreatedAt   int64  `json:"c"` // Unix µs
	TraceParent string `json:"tp,omitempty"`
	TraceState  string `json:"ts,omitempty"`
}

const bodyVersion = 1

func newBody(d *queue.Delivery) body {
	b := body{V: bodyVersion, Key: d.Key, Row: d.Row, Base: d.Base, Attempt: d.Attempt, Lapsed: d.Lapsed, EndpointID: d.EndpointID,
		Event: eventBody{ID: d.Event.ID, Tenant: d.Event.Tenant, Type: d.Event.Type, Version: d.Event.Version,
			CreatedAt: d.Event.CreatedAt.UnixMicro(), TraceParent: d.Event.TraceParent, TraceState: d.Event.TraceState},
		Payload: d.Event.Payload}
	if !d.RefusedSince.IsZero() {
		b.RefusedSince = d.RefusedSince.UnixMicro()
	}
	return b
}

// delivery is b as a queue.Delivery (without what the message adds).
func (b body) delivery() *queue.Delivery {
	d := &queue.Delivery{Key: b.Key, Row: b.Row, Base: b.Base, Attempt: b.Attempt, Lapsed: b.Lapsed, EndpointID: b.EndpointID,
		Event: queue.Event{ID: b.Event.ID, Tenant: b.Event.Tenant, Type: b.Event.Type, Version: b.Event.Version,
			Payload: b.Payload, CreatedAt: time.UnixMicro(b.Event.CreatedAt).UTC(),
			TraceParent: b.Event.TraceParent, TraceState: b.Event.TraceState}}
	if b.RefusedSince != 0 {
		d.RefusedSince = time.UnixMicro(b.RefusedSince).UTC()
	}
	return d
}

// sealer signs and checks messages with the stream's key (see
// store.BrokerKey): forwarders and workers share it through the database,
// so a message published on the stream's subjects by anyone else is
// never delivered.
type sealer struct{ key []byte }

func (s sealer) mac(data []byte) string {
	m := hmac.New(sha256.New, s.key)
	m.Write(data)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// encode returns the message data of d and its MAC.
func (s sealer) encode(d *queue.Delivery) ([]byte, string, error) {
	data, err := json.Marshal(newBody(d))
	if err != nil {
		return nil, "", err
	}
	return data, s.mac(data), nil
}

// errForeign is the cause of every rejected message.
var errForeign = errors.New("not published by a txhook forwarder")

// decode checks and reads a message: its MAC, its shape, and that its
// subject is its key's.
func (s sealer) decode(prefix, subject string, data []byte, mac string) (*queue.Delivery, error) {
	want := s.mac(data)
	if mac == "" || !hmac.Equal([]byte(mac), []byte(want)) {
		return nil, fmt.Errorf("%w: no valid %s header", errForeign, headerMAC)
	}
	var b body
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("%w: body: %v", errForeign, err)
	}
	switch {
	case b.V != bodyVersion:
		return nil, fmt.Errorf("%w: message version %d", errForeign, b.V)
	case b.Base < 0 || b.Attempt <= b.Base || b.Key == "" || b.EndpointID == "" || b.Event.ID == "" || b.Event.Tenant == "":
		return nil, fmt.Errorf("%w: incomplete delivery", errForeign)
	case subject != queueSubject(prefix, b.Key):
		return nil, fmt.Errorf("%w: subject %q is not the delivery's", errForeign, subject)
	}
	return b.delivery(), nil
}

func queueSubject(prefix, key string) string    { return prefix + ".q." + key }
func scheduleSubject(prefix, key string) string { return prefix + ".s." + key }
func rejectSubject(prefix string) string        { return prefix + ".rejected" }

// eventKey is the key of the delivery of a new event to an endpoint,
// rowKey that of a delivery row.
func eventKey(eventID, endpointID string) string { return "e." + eventID + "." + endpointID }
func rowKey(id int64) string                     { return "r." + strconv.FormatInt(id, 10) }

// msgID is the Nats-Msg-Id of attempt of the delivery key: a delivery's
// attempt is published once, however often a crash makes it published.
func msgID(key string, attempt int) string { return key + "/" + strconv.Itoa(attempt) }

// validToken reports whether s can be one token of a subject.
func validToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ". *>\t\r\n")
}
