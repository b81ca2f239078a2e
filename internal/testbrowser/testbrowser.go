// Package testbrowser starts the headless Chromium that the browser tests
// of the operations UI (dlq) and the merchant portal (outbox/portal) drive.
package testbrowser

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// Environment of the browser tests.
const (
	// EnvRequire, set to 1, makes a missing Chromium fail a browser test
	// instead of skipping it (CI sets it).
	EnvRequire = "TXHOOK_REQUIRE_BROWSER"
	// EnvChromium overrides where Chromium is.
	EnvChromium = "TXHOOK_CHROMIUM"
)

// Path is where Chromium is: TXHOOK_CHROMIUM, /usr/bin/chromium, or
// chromium or chromium-browser on the PATH; "" when none.
func Path() string {
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Start starts headless Chromium in a window of width × height, sending
// headers with every request, and returns its context, which ends after
// timeout; everything is shut down when t ends. Without Chromium the test
// is skipped, or fails when TXHOOK_REQUIRE_BROWSER=1.
func Start(t *testing.T, width, height int, timeout time.Duration, headers map[string]string) context.Context {
	t.Helper()
	path := Path()
	if path == "" {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("Chromium not found but %s=1: install Debian's chromium (.ci/install-browser.sh) or set %s", EnvRequire, EnvChromium)
		}
		t.Skipf("browser test skipped: Chromium not found at /usr/bin/chromium (install Debian's chromium, or set %s); %s=1 makes this a failure", EnvChromium, EnvRequire)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		// Without these Chromium waits on the network for updates,
		// sync and QUIC probes, and hangs on a closed network.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(width, height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	ctx, cancel := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium (%s): %v", path, err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	SetHeaders(t, ctx, headers)
	return ctx
}

// SetHeaders makes the browser send headers with every request.
func SetHeaders(t *testing.T, ctx context.Context, headers map[string]string) {
	t.Helper()
	h := network.Headers{}
	for k, v := range headers {
		h[k] = v
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
		t.Fatal(err)
	}
}

// Text reads the visible text of the first element matching a CSS
// selector.
func Text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(css)))
	if err != nil {
		t.Fatalf("reading %s: %v", css, err)
	}
	return s
}
