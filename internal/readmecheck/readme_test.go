package readmecheck

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const marker = "<!-- compiled by internal/readmecheck -->"

// snippets returns the Go code of README's marked snippets.
func snippets(readme string) ([]string, error) {
	lines := strings.Split(readme, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != marker {
			continue
		}
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```go" {
			return nil, fmt.Errorf("README.md:%d: the marker must be followed by a ```go fence", i+1)
		}
		var code []string
		j := i + 2
		for ; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
			code = append(code, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("README.md:%d: unterminated fence", i+2)
		}
		out = append(out, strings.Join(code, "\n"))
		i = j
	}
	return out, nil
}

// TestREADMESnippetsCompile builds each marked snippet as a package of its
// own inside the module (through an overlay: nothing is written into the
// source tree), so that its imports resolve as a user's would.
func TestREADMESnippetsCompile(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	code, err := snippets(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(code) == 0 {
		t.Fatalf("README.md has no snippet marked %q", marker)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the snippets: %v", err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, c := range code {
		src := filepath.Join(tmp, fmt.Sprintf("snippet%d.go", i))
		if err := os.WriteFile(src, []byte("package snippet\n\n"+c+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(root, "internal", "readmecheck", fmt.Sprintf("snippet%d", i))
		overlay[filepath.Join(dir, "snippet.go")] = src
		pkgs = append(pkgs, dir)
	}
	js, _ := json.Marshal(map[string]any{"Replace": overlay})
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, js, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, append([]string{"build", "-overlay=" + ov}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.md snippets do not compile: %v\n%s", err, out)
	}
}
