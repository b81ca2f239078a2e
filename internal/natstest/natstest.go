// Package natstest runs an embedded single-node NATS server with JetStream
// for tests: file storage in a t.TempDir(), a free port on 127.0.0.1, the
// server's log kept in memory and printed only when the test fails, and a
// shutdown in t.Cleanup. [Server.Stop] and [Server.Restart] take the broker
// away and bring it back on the same store and port, so a test can watch
// clients through an outage.
//
//	s := natstest.Start(t, natstest.Options{})
//	nc, js := s.JetStream(t)
//	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}})
//
// For several server processes in a JetStream cluster (SIGKILL, leader
// failover) see internal/natscluster.
package natstest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyTimeout bounds how long a start may take to accept connections: a
// store recovered on a loaded machine takes a while.
const readyTimeout = 60 * time.Second

// Options configure an embedded server.
type Options struct {
	// Configure, if set, adjusts the server's options before every start
	// (first start and each Restart), after this package has set host,
	// port, JetStream and the store directory. Use it for JetStream limits
	// or a server name; changing Host, Port or StoreDir breaks Restart.
	Configure func(*server.Options)
}

// Server is one embedded NATS server with JetStream. Its methods are safe
// for concurrent use.
type Server struct {
	t    testing.TB
	opts Options
	dir  string
	log  *logBuffer

	mu   sync.Mutex
	port int
	srv  *server.Server
}

// Start starts a server for t and shuts it down in t.Cleanup, printing
// its log to t when the test has failed.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s := &Server{t: t, opts: opts, dir: t.TempDir(), log: &logBuffer{}, port: server.RANDOM_PORT}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("natstest: server log (%s):\n%s", s.URL(), s.log.String())
		}
	})
	if err := s.start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return s
}

// URL is the server's client URL, nats://127.0.0.1:<port>. It stays the
// same across Stop and Restart.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "nats://127.0.0.1:" + strconv.Itoa(s.port)
}

// Port is the server's client port on 127.0.0.1.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// StoreDir is JetStream's store directory.
func (s *Server) StoreDir() string { return s.dir }

// Server returns the running server (for its monitoring methods, such as
// JszAccount or HealthZ), or nil after Stop.
func (s *Server) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Running reports whether the server is up.
func (s *Server) Running() bool { return s.Server() != nil }

// Log returns what the server has logged so far (notices, warnings,
// errors).
func (s *Server) Log() string { return s.log.String() }

// Stop shuts the server down and waits until it has: clients see their
// connection close and start reconnecting. The store stays for Restart.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Restart stops the server if it runs and starts it again on the same
// store directory and port, waiting until it accepts connections with its
// streams recovered. It fails the test if the server cannot start.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("natstest: restart: %v", err)
	}
}

// start starts a server on s.port (RANDOM_PORT the first time), retrying
// while the port is taken: between a Stop and a Restart another process
// may briefly hold it.
func (s *Server) start() error {
	deadline := time.Now().Add(readyTimeout)
	wait := 10 * time.Millisecond
	for {
		err := s.startOnce()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errPortTaken) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Second)
	}
}

var errPortTaken = errors.New("port in use")

func (s *Server) startOnce() error {
	s.mu.Lock()
	port := s.port
	s.mu.Unlock()
	o := &server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   s.dir,
		NoSigs:     true,
		// The server's own defaults (one minute) make a test that waits
		// for a dead client slow.
		PingInterval: 2 * time.Second,
		MaxPingsOut:  2,
	}
	if s.opts.Configure != nil {
		s.opts.Configure(o)
	}
	srv, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("new server: %w", err)
	}
	srv.SetLogger(s.log, false, false)
	mark := s.log.mark()
	srv.Start()
	// ReadyForConnections waits out its whole timeout when a listener
	// failed, so ask in short slices and watch the log for that failure.
	deadline := time.Now().Add(readyTimeout)
	for !srv.ReadyForConnections(100 * time.Millisecond) {
		failed := strings.Contains(s.log.since(mark), "Error listening")
		if !failed && time.Now().Before(deadline) {
			continue
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		if strings.Contains(s.log.since(mark), "address already in use") && port > 0 {
			return fmt.Errorf("127.0.0.1:%d: %w", port, errPortTaken)
		}
		return fmt.Errorf("server on 127.0.0.1:%d not ready; log:\n%s", port, s.log.tail(4000))
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		return fmt.Errorf("server address %v is not TCP", srv.Addr())
	}
	s.mu.Lock()
	s.port, s.srv = addr.Port, srv
	s.mu.Unlock()
	return nil
}

// ConnectOptions are the options Connect uses, before the caller's: the
// test's name as the connection name, reconnecting forever every 25ms
// (the client does not give up during a test's broker outage), and async
// errors written to logf.
func ConnectOptions(name string, logf func(format string, args ...any)) []nats.Option {
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(25 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.Timeout(5 * time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				logf("nats: async error on %q: %v", sub.Subject, err)
				return
			}
			logf("nats: async error: %v", err)
		}),
	}
}

// Connect connects to the server with ConnectOptions and then opts, and
// closes the connection in t.Cleanup. It fails the test if the first
// connect fails (pass nats.RetryOnFailedConnect(true) to connect to a
// stopped server).
func (s *Server) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append(ConnectOptions(t.Name(), s.log.Printf), opts...)
	nc, err := nats.Connect(s.URL(), all...)
	if err != nil {
		t.Fatalf("natstest: connect to %s: %v", s.URL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream connects (as Connect does) and returns the connection with a
// JetStream context on it.
func (s *Server) JetStream(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := s.Connect(t, opts...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// logBuffer is the server's logger: lines kept in memory (at most
// maxLog bytes, the oldest dropped first), for the test to print if it
// fails. Writing to t.Log instead would panic when a server goroutine
// logs after the test has ended.
type logBuffer struct {
	mu      sync.Mutex
	buf     []byte
	dropped int // bytes dropped from the front of buf
}

const maxLog = 1 << 20

func (l *logBuffer) Printf(format string, args ...any) {
	line := time.Now().Format("15:04:05.000000 ") + fmt.Sprintf(format, args...) + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, line...)
	if len(l.buf) > maxLog {
		cut := len(l.buf) - maxLog/2
		l.dropped += cut
		l.buf = append(l.buf[:0], l.buf[cut:]...)
	}
}

// mark returns a position in the log for since.
func (l *logBuffer) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped + len(l.buf)
}

// since returns what was logged after mark (what is still kept of it).
func (l *logBuffer) since(mark int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf[max(mark-l.dropped, 0):])
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

func (l *logBuffer) tail(n int) string {
	s := l.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

func (l *logBuffer) Noticef(format string, v ...any) { l.Printf("[INF] "+format, v...) }
func (l *logBuffer) Warnf(format string, v ...any)   { l.Printf("[WRN] "+format, v...) }
func (l *logBuffer) Fatalf(format string, v ...any)  { l.Printf("[FTL] "+format, v...) }
func (l *logBuffer) Errorf(format string, v ...any)  { l.Printf("[ERR] "+format, v...) }
func (l *logBuffer) Debugf(format string, v ...any)  { l.Printf("[DBG] "+format, v...) }
func (l *logBuffer) Tracef(format string, v ...any)  { l.Printf("[TRC] "+format, v...) }
