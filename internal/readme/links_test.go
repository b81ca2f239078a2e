package readme

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// link matches a Markdown link or image, [text](target) or ![alt](target),
// with an optional title after the target.
var link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// codeSpan matches inline code, whose brackets are not links.
var codeSpan = regexp.MustCompile("`[^`]*`")

// links returns the targets of the links in a Markdown text outside code
// blocks and code spans, with the line of each.
func links(text string) (targets []string, lines []int) {
	fenced := false
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, i+1)
		}
	}
	return targets, lines
}

// anchors returns the anchors GitHub gives the headings of a Markdown
// text: lower case, punctuation dropped, spaces turned into hyphens, and
// "-1", "-2", ... after a repeated one.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}

// TestLinks checks that every relative link of the module's Markdown files
// names a file or directory that exists and, for a #fragment into a
// Markdown file, a heading of that file: moving a section between the
// README and the topic pages under docs/ must not leave a link behind.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	read := func(file string) string {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	checked := 0
	for _, file := range markdownFiles(t, root) {
		targets, lines := links(read(file))
		for i, target := range targets {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			name, frag, _ := strings.Cut(target, "#")
			dest := file
			if name != "" {
				dest = path.Clean(path.Join(path.Dir(file), name))
				if strings.HasPrefix(dest, "../") {
					t.Errorf("%s:%d: %s points outside the module", file, lines[i], target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
					t.Errorf("%s:%d: %s: no such file or directory (%s)", file, lines[i], target, dest)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !anchors(read(dest))[frag] {
				t.Errorf("%s:%d: %s: %s has no heading with the anchor #%s", file, lines[i], target, dest, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link pattern is broken")
	}
}

func TestAnchors(t *testing.T) {
	got := anchors("# A title\n## Egress proxy, endpoint headers and mTLS\n```sh\n# not a heading\n```\n## `outbox.Config`\n## A title\n")
	for _, want := range []string{"a-title", "egress-proxy-endpoint-headers-and-mtls", "outboxconfig", "a-title-1"} {
		if !got[want] {
			t.Errorf("anchor %q missing from %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a comment in a code block became an anchor: %v", got)
	}
}
