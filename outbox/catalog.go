package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Catalog is the list of event types a platform sends, with their schema
// versions and the converters between versions. Hosts show it to their
// customers (Types), and relays use it to deliver each event in the version
// an endpoint pinned, so an integration built against version 1 keeps
// receiving version 1 after the platform moves to version 2.
//
// Register every type at start-up, then set Config.Catalog. A Catalog is
// safe for concurrent use.
type Catalog struct {
	mu    sync.RWMutex
	types map[string]*catalogEntry
}

type catalogEntry struct {
	t    EventType
	conv map[[2]int]Converter
}

// EventType describes one event type.
type EventType struct {
	Name        string
	Description string
	// Versions lists the type's schema versions, oldest first, numbered
	// from 1 without gaps.
	Versions []SchemaVersion
}

// SchemaVersion is one version of an event type's payload.
type SchemaVersion struct {
	Version     int
	Description string          // what changed, for the changelog
	Example     json.RawMessage // an example payload
}

// Converter turns a payload of one schema version into the adjacent one. It
// must be deterministic: a delivery's body is rebuilt on every attempt and
// must not change between attempts.
type Converter func(data json.RawMessage) (json.RawMessage, error)

// ErrUnknownEventType is returned by Enqueue, CreateEndpoint and
// UpdateEndpoint when a Catalog is configured and does not list the type or
// version.
var ErrUnknownEventType = errors.New("txhook: event type or version not in the catalog")

// NewCatalog returns an empty catalog.
func NewCatalog() *Catalog { return &Catalog{types: map[string]*catalogEntry{}} }

// Register adds or replaces an event type.
func (c *Catalog) Register(t EventType) error {
	if !typePattern.MatchString(t.Name) {
		return fmt.Errorf("%w: event type name %.64q", ErrInvalidEvent, t.Name)
	}
	if len(t.Versions) == 0 {
		return fmt.Errorf("%w: %s has no versions", ErrInvalidEvent, t.Name)
	}
	for i, v := range t.Versions {
		if v.Version != i+1 {
			return fmt.Errorf("%w: %s: versions must be numbered 1, 2, 3 … in order", ErrInvalidEvent, t.Name)
		}
		if len(v.Example) > 0 && !json.Valid(v.Example) {
			return fmt.Errorf("%w: %s version %d: example is not JSON", ErrInvalidPayload, t.Name, v.Version)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.types[t.Name]
	if e == nil {
		e = &catalogEntry{conv: map[[2]int]Converter{}}
		c.types[t.Name] = e
	}
	e.t = t
	return nil
}

// AddConverter registers fn to turn version from of typ into version to,
// which must be adjacent (from±1). Relays chain converters to bridge
// several versions.
func (c *Catalog) AddConverter(typ string, from, to int, fn Converter) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.types[typ]
	if e == nil {
		return fmt.Errorf("%w: %.64q", ErrUnknownEventType, typ)
	}
	n := len(e.t.Versions)
	if from < 1 || from > n || to < 1 || to > n || (from-to != 1 && to-from != 1) || fn == nil {
		return fmt.Errorf("%w: converter %s %d→%d: versions must exist and be adjacent", ErrInvalidEvent, typ, from, to)
	}
	e.conv[[2]int{from, to}] = fn
	return nil
}

// Types returns the registered event types, sorted by name.
func (c *Catalog) Types() []EventType {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]EventType, 0, len(c.types))
	for _, e := range c.types {
		out = append(out, e.t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Latest returns the newest version of typ.
func (c *Catalog) Latest(typ string) (int, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.types[typ]
	if e == nil {
		return 0, false
	}
	return len(e.t.Versions), true
}

// has reports whether typ has version v.
func (c *Catalog) has(typ string, v int) bool {
	n, ok := c.Latest(typ)
	return ok && v >= 1 && v <= n
}

// Convert turns data of version from into version to through the chain of
// registered converters.
func (c *Catalog) Convert(typ string, from, to int, data json.RawMessage) (json.RawMessage, error) {
	step := 1
	if to < from {
		step = -1
	}
	for v := from; v != to; v += step {
		c.mu.RLock()
		var fn Converter
		if e := c.types[typ]; e != nil {
			fn = e.conv[[2]int{v, v + step}]
		}
		c.mu.RUnlock()
		if fn == nil {
			return nil, fmt.Errorf("no converter for %s from version %d to %d", typ, v, v+step)
		}
		out, err := fn(data)
		if err != nil {
			return nil, fmt.Errorf("converting %s from version %d to %d: %w", typ, v, v+step, err)
		}
		if !json.Valid(out) {
			return nil, fmt.Errorf("converting %s from version %d to %d: result is not JSON", typ, v, v+step)
		}
		data = out
	}
	return data, nil
}

// example returns the example payload of version v of typ; nil if none.
func (c *Catalog) example(typ string, v int) json.RawMessage {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.types[typ]
	if e == nil || v < 1 || v > len(e.t.Versions) {
		return nil
	}
	return e.t.Versions[v-1].Example
}
