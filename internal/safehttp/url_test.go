package safehttp

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hostsLookup resolves names from a map and fails for the rest, counting
// calls. It stands in for DNS.
func hostsLookup(hosts map[string]string) func(context.Context, string) ([]net.IPAddr, error) {
	return func(ctx context.Context, host string) ([]net.IPAddr, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, ok := hosts[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		var out []net.IPAddr
		for _, a := range strings.Split(s, ",") {
			out = append(out, net.IPAddr{IP: net.ParseIP(a)})
		}
		return out, nil
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	lookup := hostsLookup(map[string]string{
		"public.example":           "8.8.8.8",
		"dual.example":             "8.8.8.8,2606:4700:4700::1111",
		"loopback.example":         "127.0.0.1",
		"mixed.example":            "8.8.8.8,10.0.0.7",
		"mapped.example":           "::ffff:127.0.0.1",
		"metadata.google.internal": "169.254.169.254",
	})
	strict := Config{LookupIPAddr: lookup}
	withHTTP := Config{LookupIPAddr: lookup, AllowHTTP: true}
	private := Config{LookupIPAddr: lookup, AllowPrivate: true, AllowHTTP: true}

	tests := []struct {
		name string
		url  string
		cfg  Config
		want error // nil means accepted
	}{
		{"relative", "/hooks/in", strict, ErrInvalidURL},
		{"no scheme host", "hooks.example.com/in", strict, ErrInvalidURL},
		{"ftp", "ftp://8.8.8.8/x", strict, ErrInvalidURL},
		{"javascript", "javascript:alert(1)", strict, ErrInvalidURL},
		{"http when https required", "http://8.8.8.8/in", strict, ErrInsecureScheme},
		{"http allowed", "http://8.8.8.8/in", withHTTP, nil},
		{"userinfo", "https://user:secret@8.8.8.8/in", strict, ErrInvalidURL},
		{"user only", "https://user@8.8.8.8/in", strict, ErrInvalidURL},
		{"empty host", "https:///in", strict, ErrInvalidURL},
		{"port only", "https://:443/in", strict, ErrInvalidURL},
		{"opaque", "https:8.8.8.8", strict, ErrInvalidURL},
		{"fragment", "https://8.8.8.8/in#frag", strict, ErrInvalidURL},
		{"empty fragment", "https://8.8.8.8/in#", strict, ErrInvalidURL},
		{"port zero", "https://8.8.8.8:0/in", strict, ErrInvalidURL},
		{"port too big", "https://8.8.8.8:70000/in", strict, ErrInvalidURL},
		{"unparseable", "https://8.8.8.8:x/in", strict, ErrInvalidURL},
		{"localhost", "https://localhost/", Config{}, ErrForbiddenAddress},
		{"loopback v4", "https://127.0.0.1/", strict, ErrForbiddenAddress},
		{"loopback v6", "https://[::1]/", strict, ErrForbiddenAddress},
		{"private", "https://10.0.0.1/", strict, ErrForbiddenAddress},
		{"metadata", "https://169.254.169.254/latest", strict, ErrForbiddenAddress},
		{"mapped loopback", "https://[::ffff:127.0.0.1]/", strict, ErrForbiddenAddress},
		{"link-local zone", "https://[fe80::1%25eth0]/", strict, ErrForbiddenAddress},
		{"decimal int", "https://2130706433/", strict, ErrInvalidURL},
		{"hex", "https://0x7f.0.0.1/", strict, ErrInvalidURL},
		{"short form", "https://127.1/", strict, ErrInvalidURL},
		{"octal", "https://0177.0.0.1/", strict, ErrInvalidURL},
		{"trailing dot", "https://127.0.0.1./", strict, ErrInvalidURL},
		{"legacy even with AllowPrivate", "https://2130706433/", private, ErrInvalidURL},
		{"metadata name (hook)", "https://metadata.google.internal/", strict, ErrForbiddenAddress},
		{"metadata name (unresolvable)", "https://metadata.google.internal/", Config{LookupIPAddr: hostsLookup(nil)}, ErrHostNotFound},
		{"name to loopback", "https://loopback.example/in", strict, ErrForbiddenAddress},
		{"name to mapped loopback", "https://mapped.example/in", strict, ErrForbiddenAddress},
		{"one bad address of two", "https://mixed.example/in", strict, ErrForbiddenAddress},
		{"unknown name", "https://nx.example/in", strict, ErrHostNotFound},
		{"name to public", "https://public.example/in?x=1", strict, nil},
		{"name to two public", "https://dual.example:8443/in", strict, nil},
		{"public v4 literal", "https://8.8.8.8/in", Config{}, nil},
		{"public v6 literal", "https://[2606:4700:4700::1111]/in", Config{}, nil},
		{"uppercase scheme", "HTTPS://8.8.8.8/in", Config{}, nil},
		{"AllowPrivate loopback", "http://127.0.0.1:8080/in", private, nil},
		{"AllowPrivate name", "https://loopback.example/in", private, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := CheckURL(ctx, tt.url, tt.cfg)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("CheckURL(%q) = %v, want nil", tt.url, err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("CheckURL(%q) = %v, want %v", tt.url, err, tt.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error leaks credentials: %v", err)
			}
		})
	}
}

func TestCheckURLMessageNamesAddress(t *testing.T) {
	t.Parallel()
	cfg := Config{LookupIPAddr: hostsLookup(map[string]string{"meta.example": "169.254.169.254"})}
	err := CheckURL(context.Background(), "https://meta.example/x", cfg)
	if err == nil || !strings.Contains(err.Error(), "169.254.169.254") || !strings.Contains(err.Error(), "meta.example") {
		t.Fatalf("err = %v, want it to name the host and the address", err)
	}
}

func TestCheckURLRespectsContext(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	cfg := Config{LookupIPAddr: func(ctx context.Context, host string) ([]net.IPAddr, error) {
		calls.Add(1)
		<-ctx.Done() // a resolver that never answers
		return nil, ctx.Err()
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := CheckURL(ctx, "https://slow.example/", cfg)
	if !errors.Is(err, ErrDNSUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrDNSUnavailable wrapping context.DeadlineExceeded", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("lookup called %d times", calls.Load())
	}
}
