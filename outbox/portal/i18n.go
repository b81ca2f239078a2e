package portal

import (
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/webui"
	"github.com/txhook/txhook/outbox"
)

// locale is one language's messages and formats.
type locale struct {
	Lang  string // "en", "zh"
	msgs  map[string]string
	units webui.Units
}

var locales = func() map[string]*locale {
	ls := map[string]*locale{
		"en": {Lang: "en", msgs: map[string]string{}, units: webui.Units{S: "s", M: "m", H: "h", D: "d"}},
		"zh": {Lang: "zh", msgs: map[string]string{}, units: webui.Units{S: "秒", M: "分钟", H: "小时", D: "天"}},
	}
	for k, m := range messages {
		ls["en"].msgs[k], ls["zh"].msgs[k] = m[0], m[1]
	}
	return ls
}()

// HTMLLang is the lang attribute of the page.
func (l *locale) HTMLLang() string {
	if l.Lang == "zh" {
		return "zh-Hans"
	}
	return l.Lang
}

func (l *locale) has(key string) bool { _, ok := l.msgs[key]; return ok }

// T translates key, formatting args into it (fmt verbs).
func (l *locale) T(key string, args ...any) string {
	s, ok := l.msgs[key]
	if !ok {
		// A missing key is a bug the catalog test catches; show the key
		// rather than nothing.
		return key
	}
	if len(args) > 0 {
		return fmt.Sprintf(s, args...)
	}
	return s
}

// Rough writes a duration in its two largest units.
func (l *locale) Rough(d time.Duration) string { return webui.Roughly(d, l.units) }

// Ago says how long before now t was.
func (l *locale) Ago(now, t time.Time) string {
	if t.IsZero() {
		return l.T("time.never")
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return l.T("time.in", l.Rough(-d))
	case d < time.Second:
		return l.T("time.now")
	}
	return l.T("time.ago", l.Rough(d))
}

// Reason says why an attempt failed: its error, which names the status
// when there was one, or the status. Errors come from the relay in
// English and are shown as they are (escaped), like response bodies.
func (l *locale) Reason(status int, err string) string {
	if err != "" {
		return err
	}
	if status == 0 {
		return l.T("attempt.noresponse")
	}
	return l.T("attempt.status", status)
}

// Action names an audit log action.
func (l *locale) Action(a string) string {
	if l.has("action." + a) {
		return l.T("action." + a)
	}
	return a
}

// RequestHeaders shows the headers an attempt was sent with.
func (l *locale) RequestHeaders(a outbox.Attempt) template.HTML {
	return requestHeaders(l, a)
}

// localeOf chooses the language of r: Config.Locale's, else the best of
// Accept-Language by q-value, else English.
func (p *Portal) localeOf(r *http.Request) *locale {
	if p.cfg.Locale != nil {
		if l, ok := locales[normLang(p.cfg.Locale(r))]; ok {
			return l
		}
	}
	return locales[acceptLanguage(r.Header.Values("Accept-Language"))]
}

// normLang maps a language tag to "en", "zh" or "".
func normLang(tag string) string {
	tag = strings.ToLower(strings.TrimSpace(tag))
	base, rest, _ := strings.Cut(tag, "-")
	switch base {
	case "en":
		return "en"
	case "zh":
		// Traditional Chinese is not Simplified: zh-Hant, zh-TW, zh-HK and
		// zh-MO fall back to the next choice.
		if strings.Contains(rest, "hant") || strings.HasPrefix(rest, "tw") || strings.HasPrefix(rest, "hk") || strings.HasPrefix(rest, "mo") {
			return ""
		}
		return "zh"
	}
	return ""
}

// acceptLanguage picks "en" or "zh" from Accept-Language values: the
// supported tag of highest q (the first of equal ones); "en" when none.
func acceptLanguage(vals []string) string {
	type choice struct {
		lang string
		q    float64
		pos  int
	}
	var cs []choice
	for _, v := range vals {
		for _, part := range strings.Split(v, ",") {
			tag, params, _ := strings.Cut(part, ";")
			q := 1.0
			for _, prm := range strings.Split(params, ";") {
				k, val, ok := strings.Cut(strings.TrimSpace(prm), "=")
				if ok && strings.EqualFold(k, "q") {
					f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
					if err != nil || f < 0 || f > 1 {
						f = 0
					}
					q = f
				}
			}
			if lang := normLang(tag); lang != "" && q > 0 {
				cs = append(cs, choice{lang, q, len(cs)})
			}
		}
	}
	if len(cs) == 0 {
		return "en"
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].q > cs[j].q })
	return cs[0].lang
}
