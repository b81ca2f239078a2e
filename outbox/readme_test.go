package outbox_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeSnippet returns the first Go block of the README section headed
// heading.
func readmeSnippet(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, code, ok := strings.Cut(section, "```go\n")
	if !ok {
		t.Fatalf("README section %q has no Go block", heading)
	}
	code, _, _ = strings.Cut(code, "```")
	return code
}

// compileSnippet type-checks a README fragment as the body of a function
// whose parameters are the names it uses without declaring them, in a
// scratch module that uses this repository, and fails t with the
// compiler's message. Every name the fragment declares counts as used.
func compileSnippet(t *testing.T, code, imports, params string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to compile the README snippet with")
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "snippet.go", "package p\nfunc f() {\n"+code+"\n}", 0)
	if err != nil {
		t.Fatalf("README snippet does not parse: %v", err)
	}
	var uses []string
	seen := map[string]bool{}
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		if as, ok := st.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
			for _, e := range as.Lhs {
				if id, ok := e.(*ast.Ident); ok && id.Name != "_" && !seen[id.Name] {
					seen[id.Name] = true
					uses = append(uses, "\t_ = "+id.Name)
				}
			}
		}
	}
	src := "package readme\n\nimport (\n" + imports + "\n)\n\nfunc snippet(" + params + ") {\n" + code + strings.Join(uses, "\n") + "\n}\n"

	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module readmecheck\n\ngo 1.26\n\nrequire github.com/txhook/txhook v0.0.0\n\nreplace github.com/txhook/txhook => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "snippet.go": []byte(src)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goBin, "build", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("README snippet does not compile: %v\n%s\n%s", err, out.String(), src)
	}
}

func TestReadmeEgressSnippetCompiles(t *testing.T) {
	compileSnippet(t, readmeSnippet(t, "## Egress proxy, endpoint headers and mTLS"),
		"\t\"context\"\n\t\"net/url\"\n\n\t\"github.com/txhook/txhook/outbox\"",
		"ctx context.Context, ob *outbox.Outbox, proxyPassword, merchantToken string, certPEM, keyPEM []byte")
}
