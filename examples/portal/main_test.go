package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"
)

// The demo seeds its merchants, prints working links, and stops when its
// context ends.
func TestPortalDemoRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, pw, "127.0.0.1:0", "")
		pw.CloseWithError(err)
		done <- err
	}()
	links := map[string]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		if f := strings.Fields(line); len(f) == 2 && strings.Contains(f[1], "/portal/link?token=") {
			links[f[0]] = f[1]
		}
		if line == "ready" {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if len(links) != len(merchants) {
		t.Fatalf("links printed: %v", links)
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: time.Minute}
	res, err := c.Get(links["globex"])
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	page := string(b)
	if res.StatusCode != 200 || !strings.Contains(page, "globex analytics (down)") || !strings.Contains(page, "503") || strings.Contains(page, "acme") {
		t.Fatalf("globex's portal: %d\n%s", res.StatusCode, page)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
