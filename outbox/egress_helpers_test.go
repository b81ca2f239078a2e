package outbox_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/outbox"
)

// connectProxy is an HTTP CONNECT proxy on loopback, as smokescreen is to
// a relay: it resolves and dials the target itself, counts the tunnels it
// opened and the targets it was asked for, and, with auth set, refuses
// requests without that Proxy-Authorization with 407.
type connectProxy struct {
	*httptest.Server
	auth string // the Proxy-Authorization value required; "" for none

	mu      sync.Mutex
	tunnels int
	targets []string
	other   int // requests that were not CONNECT
}

func newConnectProxy(t testing.TB, auth string) *connectProxy {
	p := startConnectProxy(auth)
	t.Cleanup(p.Close)
	return p
}

// startConnectProxy starts a connectProxy; Close stops it.
func startConnectProxy(auth string) *connectProxy {
	p := &connectProxy{auth: auth}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	return p
}

func (p *connectProxy) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if r.Method != http.MethodConnect {
		p.other++
		p.mu.Unlock()
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	p.targets = append(p.targets, r.Host)
	p.mu.Unlock()
	if p.auth != "" && r.Header.Get("Proxy-Authorization") != p.auth {
		w.Header().Set("Proxy-Authenticate", `Basic realm="egress"`)
		http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	target, err := net.DialTimeout("tcp", r.Host, 10*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		target.Close()
		return
	}
	p.mu.Lock()
	p.tunnels++
	p.mu.Unlock()
	io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() {
		io.Copy(target, conn)
		target.Close()
	}()
	go func() {
		io.Copy(conn, target)
		conn.Close()
	}()
}

// stats returns the tunnels opened, the targets asked for and the
// requests that were not CONNECT.
func (p *connectProxy) stats() (int, []string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tunnels, append([]string(nil), p.targets...), p.other
}

// dnsServer is a DNS server on loopback UDP: it answers A queries for the
// names in a, NXDOMAIN for names under .invalid, and SERVFAIL for the rest.
type dnsServer struct {
	conn net.PacketConn
	a    map[string]netip.Addr
}

func newDNSServer(t testing.TB, a map[string]string) *dnsServer {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{conn: pc, a: map[string]netip.Addr{}}
	for name, ip := range a {
		s.a[name] = netip.MustParseAddr(ip)
	}
	t.Cleanup(func() { pc.Close() })
	go s.serve()
	return s
}

// resolver returns a pure-Go resolver that asks only s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
	}}
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp := s.answer(buf[:n]); resp != nil {
			s.conn.WriteTo(resp, from)
		}
	}
}

// answer builds the response to one query: the header, the question, and
// an A record when there is one.
func (s *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	// The question: labels up to the root, then type and class.
	i := 12
	var labels []string
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	i++ // the root label
	if i+4 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i:])
	question := q[12 : i+4]
	name := strings.ToLower(strings.Join(labels, "."))

	rcode, answers := uint16(0), 0
	ip, known := s.a[name]
	switch {
	case known && qtype == 1 && ip.Is4():
		answers = 1
	case known:
		// NOERROR, no record of this type.
	case strings.HasSuffix(name, ".invalid"):
		rcode = 3 // NXDOMAIN
	default:
		rcode = 2 // SERVFAIL
	}
	resp := make([]byte, 12, 64+len(question))
	copy(resp, q[:2])                                                    // ID
	binary.BigEndian.PutUint16(resp[2:], 0x8180|rcode|uint16(q[2]&1)<<8) // QR, RD as asked, RA
	binary.BigEndian.PutUint16(resp[4:], 1)                              // QDCOUNT
	binary.BigEndian.PutUint16(resp[6:], uint16(answers))                // ANCOUNT
	resp = append(resp, question...)
	if answers == 1 {
		a4 := ip.As4()
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		resp = append(resp, a4[:]...)
	}
	return resp
}

// testCA issues certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "txhook test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// client issues a client certificate for cn valid until notAfter and
// returns it and its key, PEM-encoded.
func (ca *testCA) client(t testing.TB, cn string, notAfter time.Time) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// mtlsServer is an https server on loopback that requires a client
// certificate issued by its CA and sends the common name of every client
// it served on peers.
type mtlsServer struct {
	*httptest.Server
	ca    *testCA
	peers chan string
	roots *x509.CertPool // trust the server's certificate: RelayConfig.RootCAs
}

func newMTLSServer(t testing.TB) *mtlsServer {
	s := &mtlsServer{ca: newTestCA(t), peers: make(chan string, 100)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.peers <- r.TLS.PeerCertificates[0].Subject.CommonName
	}))
	s.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: s.ca.pool}
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	s.StartTLS()
	t.Cleanup(s.Close)
	s.roots = s.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	return s
}

// clientCert issues a client certificate for cn, valid for an hour.
func (s *mtlsServer) clientCert(t testing.TB, cn string) *outbox.ClientCert {
	certPEM, keyPEM := s.ca.client(t, cn, time.Now().Add(time.Hour))
	return &outbox.ClientCert{CertPEM: certPEM, KeyPEM: keyPEM}
}
