package portal_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

// Every message has both languages, with the same format verbs, and the
// Chinese one is Chinese; every key the templates and the code use is in
// the catalog.
func TestMessagesComplete(t *testing.T) {
	verbs := regexp.MustCompile(`%[dsvq]`)
	for k, m := range portal.Messages {
		if strings.TrimSpace(m[0]) == "" || strings.TrimSpace(m[1]) == "" {
			t.Errorf("%s: missing a language: %q", k, m)
		}
		if a, b := verbs.FindAllString(m[0], -1), verbs.FindAllString(m[1], -1); strings.Join(a, "") != strings.Join(b, "") {
			t.Errorf("%s: verbs %v in English, %v in Chinese", k, a, b)
		}
		// Only "HTTP %d" reads the same in both.
		if !strings.ContainsFunc(m[1], func(r rune) bool { return unicode.Is(unicode.Han, r) }) && k != "attempt.status" {
			t.Errorf("%s: the Chinese %q has no Chinese", k, m[1])
		}
	}
	used := map[string]bool{}
	for _, s := range []string{"rate_desc.24h", "rate_desc.7d", "latency_desc.24h", "latency_desc.7d"} {
		used["chart."+s] = true
	}
	for _, s := range []string{"400", "403", "404", "409", "500"} {
		used["status."+s] = true
	}
	for _, s := range []string{outbox.StatePending, outbox.StateRunning, outbox.StateSucceeded, outbox.StateDead, outbox.StatePaused, outbox.StateBlocked} {
		used["dstate."+s] = true
	}
	tmpl := regexp.MustCompile(`\.T "([a-z0-9_.]+)"`)
	code := regexp.MustCompile(`"((?:err|done|secret|nav|form|time|attempt|status|state|chart)\.[a-z0-9_]+)"`)
	files, _ := filepath.Glob("templates/*.html")
	gofiles, _ := filepath.Glob("*.go")
	for _, f := range append(files, gofiles...) {
		if strings.HasSuffix(f, "_test.go") || f == "messages.go" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, re := range []*regexp.Regexp{tmpl, code} {
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				used[m[1]] = true
			}
		}
	}
	if len(used) < 100 {
		t.Fatalf("found only %d keys in use: the scan is broken", len(used))
	}
	for k := range used {
		if _, ok := portal.Messages[k]; !ok {
			t.Errorf("key %q is used but not in the catalog", k)
		}
	}
}

func TestAcceptLanguage(t *testing.T) {
	for h, want := range map[string]string{
		"":                             "en",
		"zh-CN,zh;q=0.9,en;q=0.8":      "zh",
		"en-US,en;q=0.9,zh-CN;q=0.8":   "en",
		"fr-FR, zh;q=0.5, en;q=0.4":    "zh",
		"en;q=0.2, zh-Hans;q=0.7":      "zh",
		"zh-TW,zh-Hant;q=0.9,en;q=0.5": "en",
		"zh;q=0, en":                   "en",
		"de":                           "en",
		"ZH-cn":                        "zh",
		"zh-CN;q=abc, en;q=0.1":        "en",
	} {
		if got := portal.AcceptLanguage([]string{h}); got != want {
			t.Errorf("%q: %s, want %s", h, got, want)
		}
	}
}

// The key pages in Chinese carry no English string of the catalog.
func TestChinesePagesHaveNoEnglish(t *testing.T) {
	s := seed(t, testdb.SQLite(t))
	acme := s.login("acme")
	acme.lang = "zh-CN,zh;q=0.9,en;q=0.8"
	_, _ = acme.post("endpoints/"+s.okEp.ID+"/rotate", url.Values{"overlap": {"24h"}})
	res, secretPage := acme.post("endpoints", url.Values{"url": {"http://127.0.0.1:1/new"}})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("create: %d", res.StatusCode)
	}
	_, notFound := acme.do("GET", "/portal/endpoints/nope", nil, nil)
	_, forbidden := (&user{e: s.env, client: newClient(), lang: acme.lang}).do("GET", "/portal/endpoints", nil, nil)
	pages := map[string]string{"secret": secretPage, "404": notFound, "403": forbidden}
	for _, p := range []string{"endpoints", "endpoints/" + s.okEp.ID, "endpoints/" + s.failEp.ID, "endpoints/new", "endpoints/" + s.okEp.ID + "/edit",
		"deliveries", "deliveries/" + strconv.FormatInt(s.failed.ID, 10), "deliveries/" + strconv.FormatInt(s.ok.ID, 10), "events/" + s.event, "catalog", "audit"} {
		pages[p] = acme.get(p)
	}
	tags := regexp.MustCompile(`<[^>]*>`)
	for name, body := range pages {
		if !strings.Contains(body, `lang="zh-Hans"`) {
			t.Errorf("%s: not served in Chinese", name)
		}
		text := tags.ReplaceAllString(body, " ")
		for k, m := range portal.Messages {
			en := m[0]
			if i := strings.Index(en, "%"); i >= 0 {
				en = en[:i]
			}
			en = strings.TrimSpace(en)
			// Terms both languages use ("Webhooks", "HTTP", "URL") are
			// not leaks.
			if len(en) < 4 || strings.Contains(m[1], en) || !strings.ContainsFunc(en, unicode.IsLetter) {
				continue
			}
			// As a phrase of its own: "Event" inside the header name
			// Webhook-Event-Type is data, not a message.
			if regexp.MustCompile(`(?:^|[^\w-])` + regexp.QuoteMeta(en) + `(?:$|[^\w-])`).MatchString(text) {
				t.Errorf("%s: English %q (%s) in the Chinese page", name, en, k)
			}
		}
	}
}
