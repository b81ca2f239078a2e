package natscluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// EnvServer names a nats-server binary to run instead of one built from
// the module in go.mod. .ci/nats.sh builds that one and prints its path.
const EnvServer = "TXHOOK_NATS_SERVER"

// serverModule is the module the binary is built from, at the version
// go.mod requires.
const serverModule = "github.com/nats-io/nats-server/v2"

var binary struct {
	mu   sync.Mutex
	path string
}

// Binary returns the nats-server binary the clusters run: $TXHOOK_NATS_SERVER
// if set, else <user cache dir>/txhook/nats-server-<version>, built with
// `go build` from the version of github.com/nats-io/nats-server/v2 in
// go.mod the first time (about a minute) and reused by later test runs.
// Concurrent callers wait for one build; a failed one is tried again by
// the next call.
func Binary(ctx context.Context) (string, error) {
	binary.mu.Lock()
	defer binary.mu.Unlock()
	if binary.path != "" {
		return binary.path, nil
	}
	p, err := findBinary(ctx)
	if err != nil {
		return "", err
	}
	binary.path = p
	return p, nil
}

func findBinary(ctx context.Context) (string, error) {
	if p := os.Getenv(EnvServer); p != "" {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("natscluster: %s: %w", EnvServer, err)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("natscluster: %s=%s is not an executable file", EnvServer, p)
		}
		return p, nil
	}
	dir := moduleDir()
	out, err := goCmd(ctx, dir, "list", "-m", "-f", "{{.Version}}", serverModule)
	if err != nil {
		return "", err
	}
	version := strings.TrimSpace(out)
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("natscluster: %w (set %s)", err, EnvServer)
	}
	cache = filepath.Join(cache, "txhook")
	path := filepath.Join(cache, "nats-server-"+version)
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return path, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("natscluster: %w", err)
	}
	// Build beside the target and rename, so that a test process reading
	// the cache never runs a half-written binary, and two building at once
	// both end with a whole one.
	tmp, err := os.CreateTemp(cache, ".nats-server-*")
	if err != nil {
		return "", fmt.Errorf("natscluster: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if _, err := goCmd(ctx, dir, "build", "-o", tmp.Name(), serverModule); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("natscluster: %w", err)
	}
	return path, nil
}

func goCmd(ctx context.Context, dir string, args ...string) (string, error) {
	// go test puts its own toolchain first on the PATH of the test binary.
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	// A static binary without the race detector or other test flags.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("natscluster: go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// moduleDir is a directory inside txhook's module, where `go list -m`
// reads go.mod: this file's directory when the source is there (tests),
// else the working directory.
func moduleDir() string {
	if _, file, _, ok := runtime.Caller(0); ok && fileExists(file) {
		return filepath.Dir(file)
	}
	wd, _ := os.Getwd()
	return wd
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}
