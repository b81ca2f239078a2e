package readme

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// packages are those a function-body snippet may name without importing
// them, by the name it uses.
var packages = map[string]string{
	"context":     "context",
	"sql":         "database/sql",
	"fmt":         "fmt",
	"io":          "io",
	"http":        "net/http",
	"url":         "net/url",
	"os":          "os",
	"time":        "time",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
	"metric":      "go.opentelemetry.io/otel/metric",
	"trace":       "go.opentelemetry.io/otel/trace",
	"nats":        "github.com/nats-io/nats.go",
	"jetstream":   "github.com/nats-io/nats.go/jetstream",
	"broker":      "github.com/txhook/txhook/outbox/broker",
	"dlq":         "github.com/txhook/txhook/dlq",
	"portal":      "github.com/txhook/txhook/outbox/portal",
	"outbox":      "github.com/txhook/txhook/outbox",
	"metrics":     "github.com/txhook/txhook/outbox/metrics",
	"migrations":  "github.com/txhook/txhook/outbox/migrations",
	"otelmetrics": "github.com/txhook/txhook/outbox/otelmetrics",
	"pgxoutbox":   "github.com/txhook/txhook/outbox/pgxoutbox",
	"pqlisten":    "github.com/txhook/txhook/outbox/pqlisten",
	"retry":       "github.com/txhook/txhook/retry",
	"signer":      "github.com/txhook/txhook/signer",
	"verify":      "github.com/txhook/txhook/verify",
}

var marker = regexp.MustCompile(`^<!-- checked(?::(.*?))? -->$`)

const markerHelp = "<!-- checked -->, <!-- checked: ctx context.Context, ... --> or " +
	"<!-- checked: runs in FILE --> (see internal/readme/doc.go)"

// A snippet is a ```go block of a Markdown file and its marker.
type snippet struct {
	file   string // the Markdown file, relative to the module's root, with slashes
	marker int    // line of the marker
	spec   string // what follows "checked:"
	start  int    // line of the first line of code
	code   []string
}

// snippets returns the Go blocks of a Markdown file (named by file in
// errors and line directives), and an error for each that lacks a marker
// and each marker that is not followed by a Go block.
func snippets(file, text string) ([]snippet, []error) {
	lines := strings.Split(text, "\n")
	var out []snippet
	var errs []error
	for i := 0; i < len(lines); i++ {
		if m := marker.FindStringSubmatch(strings.TrimSpace(lines[i])); m != nil {
			if i+1 == len(lines) || strings.TrimSpace(lines[i+1]) != "```go" {
				errs = append(errs, fmt.Errorf("%s:%d: the marker must be followed by a ```go line", file, i+1))
			}
			continue
		}
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		s := snippet{file: file, start: i + 2}
		if i > 0 {
			if m := marker.FindStringSubmatch(strings.TrimSpace(lines[i-1])); m != nil {
				s.marker, s.spec = i, strings.TrimSpace(m[1])
			}
		}
		j := i + 1
		for ; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
			s.code = append(s.code, lines[j])
		}
		if j == len(lines) {
			errs = append(errs, fmt.Errorf("%s:%d: the Go block is not closed", file, i+1))
			break
		}
		if s.marker == 0 {
			errs = append(errs, fmt.Errorf("%s:%d: a Go block needs a marker on the line before it: %s; "+
				"use another fence than ```go for code that is not meant to compile", file, i+1, markerHelp))
		} else {
			out = append(out, s)
		}
		i = j
	}
	return out, errs
}

// markdownFiles returns the module's Markdown files (README.md, docs/*.md,
// and any other), relative to root with slashes, skipping hidden
// directories and testdata.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/SCALING.md"} {
		if !slices.Contains(files, want) {
			t.Fatalf("%s not found among the Markdown files %v", want, files)
		}
	}
	return files
}

// TestSnippets compiles every Go snippet of the module's Markdown files
// (README.md, the topic pages under docs/, ...) in one go build, as
// packages of this module held in an overlay, and compares those that a
// test runs with their copy.
func TestSnippets(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var snips []snippet
	for _, file := range markdownFiles(t, root) {
		text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		s, errs := snippets(file, string(text))
		for _, err := range errs {
			t.Error(err)
		}
		snips = append(snips, s...)
	}
	if len(snips) == 0 {
		t.Fatal("no Markdown file has a Go snippet")
	}
	if !slices.ContainsFunc(snips, func(s snippet) bool { return s.file == "README.md" }) {
		t.Error("README.md has no Go snippet: its integration example is checked here")
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, s := range snips {
		var src string
		var err error
		switch {
		case strings.HasPrefix(s.spec, "runs in "):
			err = sameAsCopy(root, strings.TrimSpace(strings.TrimPrefix(s.spec, "runs in ")), s)
		case s.spec == "":
			src, err = fileSource(s)
		default:
			src, err = bodySource(s)
		}
		if err != nil {
			t.Error(err)
		}
		if src == "" {
			continue
		}
		name := fmt.Sprintf("snippet%d", i)
		file := filepath.Join(tmp, name+".go")
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(root, "internal", "readme", name)
		overlay[filepath.Join(dir, "snippet.go")] = file
		pkgs = append(pkgs, dir)
	}
	if t.Failed() || len(pkgs) == 0 {
		return
	}
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, js, 0o644); err != nil {
		t.Fatal(err)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command compiles the snippets: %v", err)
	}
	// Not main packages: go build type-checks and compiles them, links
	// nothing and writes nothing.
	cmd := exec.Command(goTool, append([]string{"build", "-overlay=" + ov}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("Go snippets of the Markdown files do not compile (%v):\n%s", err, out)
	}
}

// fileSource returns a snippet that is a whole file as a package.
func fileSource(s snippet) (string, error) {
	src := fmt.Sprintf("package snippet\n\n//line %s:%d\n%s\n", s.file, s.start, strings.Join(s.code, "\n"))
	if _, err := parser.ParseFile(token.NewFileSet(), "snippet.go", src, 0); err != nil {
		return "", fmt.Errorf("%v\n(a snippet marked <!-- checked --> is a whole file: imports and declarations; "+
			"to check statements, name the variables they use: <!-- checked: ctx context.Context, ... -->)", err)
	}
	return src, nil
}

// bodySource returns a package with a function of the marker's parameters
// whose body is the snippet (after its import block, if any). It imports
// the packages the snippet names without importing them and uses every
// variable the body declares at its top level.
func bodySource(s snippet) (string, error) {
	imports, body, bodyStart := []string(nil), s.code, s.start
	if len(body) > 0 && strings.HasPrefix(body[0], "import (") {
		k := 1
		for k < len(body) && strings.TrimSpace(body[k]) != ")" {
			k++
		}
		if k == len(body) {
			return "", fmt.Errorf("%s:%d: the import block is not closed", s.file, s.start)
		}
		imports, body, bodyStart = body[:k+1], body[k+1:], s.start+k+1
	} else if len(body) > 0 && strings.HasPrefix(body[0], "import ") {
		imports, body, bodyStart = body[:1], body[1:], s.start+1
	}
	var head strings.Builder
	if imports != nil {
		fmt.Fprintf(&head, "//line %s:%d\n%s\n\n", s.file, s.start, strings.Join(imports, "\n"))
	}
	fmt.Fprintf(&head, "//line %s:%d\nfunc snippet(%s) {\n//line %s:%d\n%s\n",
		s.file, s.marker, s.spec, s.file, bodyStart, strings.Join(body, "\n"))
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "snippet.go", "package snippet\n\n"+head.String()+"}\n", 0)
	if err != nil {
		return "", fmt.Errorf("%v\n(a snippet marked with parameters is a function body; a whole file takes the marker <!-- checked -->)", err)
	}
	imported := map[string]bool{}
	for _, spec := range f.Imports {
		path, _ := strconv.Unquote(spec.Path.Value)
		imported[importName(spec, path)] = true
	}
	fn := f.Decls[len(f.Decls)-1].(*ast.FuncDecl)
	declared := declaredNames(fn)
	need := map[string]bool{}
	var errs []string
	ast.Inspect(fn, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok || declared[id.Name] || imported[id.Name] {
			return true
		}
		if _, ok := packages[id.Name]; !ok {
			errs = append(errs, fmt.Sprintf("%s: %s is neither declared nor a known package: name it in the marker's parameters, "+
				"import it in the snippet, or add it to packages in internal/readme/readme_test.go", fset.Position(id.Pos()), id.Name))
		}
		need[id.Name] = true
		return true
	})
	if errs != nil {
		return "", fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	var src strings.Builder
	src.WriteString("package snippet\n\n")
	for _, name := range sortedKeys(need) {
		fmt.Fprintf(&src, "import %q\n", packages[name])
	}
	src.WriteString("\n" + head.String())
	fmt.Fprintf(&src, "//line %s:%d\n", s.file, s.start+len(s.code))
	for _, name := range topLevelVars(fn) {
		fmt.Fprintf(&src, "\t_ = %s\n", name)
	}
	src.WriteString("}\n")
	return src.String(), nil
}

// importName is the name an import declares.
func importName(spec *ast.ImportSpec, path string) string {
	if spec.Name != nil {
		return spec.Name.Name
	}
	for name, p := range packages {
		if p == path {
			return name
		}
	}
	elems := strings.Split(path, "/")
	name := elems[len(elems)-1]
	if len(elems) > 1 && regexp.MustCompile(`^v[0-9]+$`).MatchString(name) {
		name = elems[len(elems)-2]
	}
	return name
}

// declaredNames are all the names fn declares, in any scope.
func declaredNames(fn *ast.FuncDecl) map[string]bool {
	names := map[string]bool{}
	add := func(exprs ...ast.Expr) {
		for _, e := range exprs {
			if id, ok := e.(*ast.Ident); ok {
				names[id.Name] = true
			}
		}
	}
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				add(n.Lhs...)
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				add(n.Key, n.Value)
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				add(id)
			}
		case *ast.TypeSpec:
			add(n.Name)
		case *ast.Field:
			for _, id := range n.Names {
				add(id)
			}
		}
		return true
	})
	return names
}

// topLevelVars are the variables fn's body declares outside any block, so
// that a snippet need not use every one.
func topLevelVars(fn *ast.FuncDecl) []string {
	seen := map[string]bool{}
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !seen[id.Name] {
			seen[id.Name] = true
			names = append(names, id.Name)
		}
	}
	for _, st := range fn.Body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, spec := range gd.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	return names
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sameAsCopy checks that the snippet is the code between "// README start"
// and "// README end" in file (relative to root), one tab less: a test
// there runs that copy, which the package's build compiles.
func sameAsCopy(root, file string, s snippet) error {
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		return fmt.Errorf("%s:%d: %v", s.file, s.marker, err)
	}
	lines := strings.Split(string(b), "\n")
	first, end := -1, -1
	for i, l := range lines {
		switch strings.TrimSpace(l) {
		case "// README start":
			if first >= 0 {
				return fmt.Errorf("%s:%d: a second \"// README start\": the file holds one snippet", file, i+1)
			}
			first = i + 1
		case "// README end":
			if end < 0 {
				end = i
			}
		}
	}
	if first < 0 || end < first {
		return fmt.Errorf("%s:%d: %s has no lines between \"// README start\" and \"// README end\"", s.file, s.marker, file)
	}
	cp := lines[first:end]
	for i := 0; i < len(cp) || i < len(s.code); i++ {
		var want, got string
		if i < len(cp) {
			want, _ = strings.CutPrefix(cp[i], "\t")
		}
		if i < len(s.code) {
			got = s.code[i]
		}
		if i >= len(cp) || i >= len(s.code) || want != got {
			return fmt.Errorf("%s:%d differs from the copy that a test runs, %s:%d:\n\tdoc:  %q\n\tcopy: %q\n"+
				"change both (the copy one tab deeper)", s.file, s.start+i, file, first+i+1, got, want)
		}
	}
	return nil
}
