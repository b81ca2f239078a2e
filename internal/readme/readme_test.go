// Package readme checks that the README's Go snippets marked as checked
// compile against the code as it is.
package readme

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// A checked snippet is a ```go block right after a line
//
//	<!-- checked: ctx context.Context, db *sql.DB -->
//
// naming the variables it uses without declaring them. It may open with
// an import block; the rest is compiled as the body of a function with
// those parameters that returns err, so the snippet must declare and use
// err (`ob, err := …`) and use every variable it declares.
var checked = regexp.MustCompile("(?m)^<!-- checked:(.*)-->\n```go\n((?s:.*?))\n```")

// qualifiers are the packages parameter types may name.
var qualifiers = map[string]string{
	"context": "context",
	"sql":     "database/sql",
	"http":    "net/http",
	"pgxpool": "github.com/jackc/pgx/v5/pgxpool",
	"trace":   "go.opentelemetry.io/otel/trace",
	"metric":  "go.opentelemetry.io/otel/metric",
}

var qualifier = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Z]`)

func TestCheckedSnippetsCompile(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippets := checked.FindAllStringSubmatch(string(readme), -1)
	if len(snippets) == 0 {
		t.Fatal("README.md has no checked snippet")
	}
	// Inside the module, so that its imports resolve as the README's
	// readers' would; "_" keeps ./... patterns away from it, so each
	// package is named.
	dir, err := os.MkdirTemp(root, "_readme-check-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	args := []string{"vet"}
	for i, s := range snippets {
		src, err := program(strings.TrimSpace(s[1]), s[2])
		if err != nil {
			t.Fatalf("snippet %d: %v", i+1, err)
		}
		name := fmt.Sprintf("s%d", i+1)
		args = append(args, "./"+filepath.Join(filepath.Base(dir), name))
		pkg := filepath.Join(dir, name)
		if err := os.Mkdir(pkg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README snippets do not compile: %v\n%s", err, out)
	}
}

// program wraps a snippet using params into a main package.
func program(params, snippet string) (string, error) {
	imports := map[string]bool{}
	body := snippet
	if rest, ok := strings.CutPrefix(snippet, "import ("); ok {
		block, after, ok := strings.Cut(rest, "\n)")
		if !ok {
			return "", fmt.Errorf("unterminated import block")
		}
		for _, line := range strings.Split(block, "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "//") {
				imports[line] = true
			}
		}
		body = after
	}
	for _, m := range qualifier.FindAllStringSubmatch(params, -1) {
		path, ok := qualifiers[m[1]]
		if !ok {
			return "", fmt.Errorf("parameter type qualifier %q unknown to the check; add it to qualifiers", m[1])
		}
		imports[`"`+path+`"`] = true
	}
	var b strings.Builder
	b.WriteString("package main\n\nimport (\n")
	lines := make([]string, 0, len(imports))
	for l := range imports {
		lines = append(lines, l)
	}
	sort.Strings(lines)
	for _, l := range lines {
		b.WriteString("\t" + l + "\n")
	}
	fmt.Fprintf(&b, ")\n\nfunc main() {}\n\nfunc snippet(%s) error {\n%s\n\treturn err\n}\n", params, body)
	return b.String(), nil
}
