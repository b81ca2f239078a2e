package safehttp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestForbidden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ip        string
		forbidden bool
	}{
		// public
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"93.184.215.14", false},
		{"2606:4700:4700::1111", false},
		{"2a00:1450:4001:82b::200e", false},
		{"64:ff9b::808:808", false}, // NAT64 of 8.8.8.8
		{"2002:808:808::1", false},  // 6to4 of 8.8.8.8
		{"::ffff:8.8.8.8", false},   // IPv4-mapped 8.8.8.8
		{"100.63.255.255", false},   // just below CGNAT
		{"100.128.0.0", false},      // just above CGNAT
		{"172.15.255.255", false},   // just below 172.16/12
		{"172.32.0.0", false},       // just above
		{"169.253.255.255", false},  // just below link-local
		{"223.255.255.255", false},  // just below multicast
		{"2001:200::1", false},      // WIDE, just past 2001::/23
		{"3ffe:ffff::1", false},     // old 6bone space, not special
		{"168.63.129.15", false},    // next to Azure's endpoint
		// IPv4 specials
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"10.0.0.1", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.168.1.1", true},
		{"169.254.169.254", true},
		{"169.254.0.23", true},
		{"100.64.0.1", true},
		{"100.100.100.200", true},
		{"192.0.0.192", true},
		{"168.63.129.16", true},
		{"192.0.2.1", true},
		{"198.51.100.1", true},
		{"203.0.113.1", true},
		{"198.18.0.1", true},
		{"192.88.99.1", true},
		{"224.0.0.1", true},
		{"239.255.255.250", true},
		{"240.0.0.1", true},
		{"255.255.255.255", true},
		// IPv6 specials
		{"::", true},
		{"::1", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fec0::1", true},
		{"fc00::1", true},
		{"fd00:ec2::254", true},
		{"ff02::1", true},
		{"2001:db8::1", true},
		{"3fff::1", true},
		{"2001::1", true},          // Teredo
		{"2001:2::1", true},        // benchmarking
		{"100::1", true},           // discard-only
		{"::ffff:127.0.0.1", true}, // IPv4-mapped
		{"::ffff:169.254.169.254", true},
		{"::ffff:10.0.0.1", true},
		{"::127.0.0.1", true},        // IPv4-compatible (deprecated)
		{"::8.8.8.8", true},          // IPv4-compatible, even public
		{"::ffff:0:7f00:1", true},    // IPv4-translated
		{"64:ff9b::7f00:1", true},    // NAT64 of 127.0.0.1
		{"64:ff9b::a9fe:a9fe", true}, // NAT64 of 169.254.169.254
		{"64:ff9b:1::808:808", true}, // local-use NAT64
		{"2002:7f00:1::", true},      // 6to4 of 127.0.0.1
		{"2002:a00:1::1", true},      // 6to4 of 10.0.0.1
		{"2002:a9fe:a9fe::", true},   // 6to4 of metadata
	}
	for _, tt := range tests {
		ip := netip.MustParseAddr(tt.ip)
		if got := Forbidden(ip); got != tt.forbidden {
			t.Errorf("Forbidden(%s) = %v, want %v (reason %q)", tt.ip, got, tt.forbidden, forbiddenReason(ip))
		}
	}
	if !Forbidden(netip.Addr{}) {
		t.Error("the zero Addr must be forbidden")
	}
}

func TestForbiddenReasonNamesEmbeddedAddress(t *testing.T) {
	t.Parallel()
	got := forbiddenReason(netip.MustParseAddr("64:ff9b::a9fe:a9fe"))
	if want := "NAT64 form of 169.254.169.254: cloud metadata"; got != want {
		t.Fatalf("reason = %q, want %q", got, want)
	}
}

func TestLegacyNumeric(t *testing.T) {
	t.Parallel()
	tests := []struct {
		host string
		want bool
	}{
		{"2130706433", true},
		{"0x7f.0.0.1", true},
		{"0x7f.1", true},
		{"127.1", true},
		{"127.0.1", true},
		{"0177.0.0.1", true},
		{"127.000.0.1", true},
		{"1.2.3.4.", true},
		{"0x7F000001", true},
		{"0x", true},
		{"example.0x10", true},
		{"a.123", true},
		{"127.0.0.1", false},
		{"8.8.8.8", false},
		{"example.com", false},
		{"1e100.net", false},
		{"123.example", false},
		{"0xdeadbeef.com", false},
		{"example.0xg", false},
		{"::1", false},
		{"localhost", false},
	}
	for _, tt := range tests {
		if got := legacyNumeric(tt.host); got != tt.want {
			t.Errorf("legacyNumeric(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestAllowPrefixes(t *testing.T) {
	t.Parallel()
	cfg := Config{AllowHTTP: true, AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("127.0.0.2/32")}}
	ctx := context.Background()
	for _, ok := range []string{"http://10.20.3.4/", "http://127.0.0.2:8080/x", "http://[::ffff:10.20.0.1]/"} {
		if err := CheckURL(ctx, ok, cfg); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"http://10.21.0.1/", "http://127.0.0.1/", "http://169.254.169.254/"} {
		if err := CheckURL(ctx, bad, cfg); !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("%s: err = %v, want ErrForbiddenAddress", bad, err)
		}
	}
	// At connect time: a server on 127.0.0.1 is refused, one on 127.0.0.2 reached.
	hit := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit++ }))
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	c := New(cfg)
	if res := c.Post(ctx, srv.URL, nil, []byte("{}")); !res.OK() {
		t.Fatalf("allowed address refused: %v", res.Err)
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit += 100 }))
	defer other.Close()
	if res := c.Post(ctx, other.URL, nil, []byte("{}")); !errors.Is(res.Err, ErrForbiddenAddress) {
		t.Fatalf("127.0.0.1 not refused: %v", res.Err)
	}
	if hit != 1 {
		t.Fatalf("hits = %d, want 1", hit)
	}
}
