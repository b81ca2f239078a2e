package svgchart_test

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/svgchart"
	"github.com/txhook/txhook/outbox"
)

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func series() []outbox.HealthPoint {
	return []outbox.HealthPoint{
		{Start: t0, Attempts: 100, Succeeded: 100, P50: 40 * time.Millisecond, P99: 180 * time.Millisecond},
		{Start: t0.Add(time.Hour), Attempts: 100, Succeeded: 95, P50: 50 * time.Millisecond, P99: 900 * time.Millisecond},
		{Start: t0.Add(2 * time.Hour)},
		{Start: t0.Add(3 * time.Hour), Attempts: 10, Succeeded: 0, P50: 2 * time.Second, P99: 3 * time.Second},
	}
}

// elements parses the SVG as XML, failing on anything malformed, and
// returns the start elements with their attributes.
func elements(t *testing.T, svg string) []xml.StartElement {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	var out []xml.StartElement
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok {
			out = append(out, se.Copy())
		}
	}
}

func attr(e xml.StartElement, name string) string {
	for _, a := range e.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func checkSafe(t *testing.T, svg string) []xml.StartElement {
	t.Helper()
	els := elements(t, svg)
	for _, e := range els {
		switch e.Name.Local {
		case "script", "foreignObject", "style", "image", "a", "use":
			t.Errorf("element %s is not allowed", e.Name.Local)
		}
		for _, a := range e.Attr {
			if a.Name.Local == "style" || strings.HasPrefix(a.Name.Local, "on") || a.Name.Local == "href" {
				t.Errorf("attribute %s on %s: needs unsafe-inline or loads something", a.Name.Local, e.Name.Local)
			}
		}
	}
	if els[0].Name.Local != "svg" || attr(els[0], "role") != "img" || attr(els[0], "aria-labelledby") != "ep1-title ep1-desc" {
		t.Errorf("root %+v", els[0])
	}
	return els
}

func TestSuccessRateBars(t *testing.T) {
	svg := string(svgchart.SuccessRate(series(), svgchart.Options{ID: "ep1", Title: `Success <24 h> & "more"`, Desc: "hourly"}))
	els := checkSafe(t, svg)
	classes := map[string]int{}
	for _, e := range els {
		if e.Name.Local == "rect" {
			for _, c := range strings.Fields(attr(e, "class")) {
				classes[c]++
			}
		}
	}
	if classes["bar"] != 4 || classes["bar-ok"] != 1 || classes["bar-warn"] != 1 || classes["bar-empty"] != 1 || classes["bar-bad"] != 1 {
		t.Errorf("bar classes %v", classes)
	}
	if !strings.Contains(svg, `<title id="ep1-title">Success &lt;24 h&gt; &amp; &#34;more&#34;</title>`) {
		t.Errorf("title not escaped:\n%s", svg)
	}
	for _, want := range []string{"01:00: 95.0% (95/100)", "02:00: no attempts", "03:00: 0.0% (0/10)"} {
		if !strings.Contains(svg, want) {
			t.Errorf("missing tooltip %q", want)
		}
	}
}

func TestLatencyLines(t *testing.T) {
	svg := string(svgchart.Latency(series(), svgchart.Options{ID: "ep1", Title: "Latency", P50: "中位数"}))
	els := checkSafe(t, svg)
	lines := map[string]int{}
	for _, e := range els {
		if e.Name.Local == "polyline" {
			lines[attr(e, "class")]++
		}
	}
	// The empty bucket breaks each line in two.
	if lines["line line-p50"] != 2 || lines["line line-p99"] != 2 {
		t.Errorf("polylines %v", lines)
	}
	// Scale: 3 s rounds up to 5 s; labels 0, 2.5 s, 5 s.
	for _, want := range []string{">5 s<", ">2.5 s<", "中位数 2 s, p99 3 s", "00:00: 中位数 40 ms, p99 180 ms"} {
		if !strings.Contains(svg, want) {
			t.Errorf("missing %q in\n%s", want, svg)
		}
	}
}

func TestEmptyAndHostileOptions(t *testing.T) {
	for _, svg := range []string{
		string(svgchart.SuccessRate(nil, svgchart.Options{ID: `x" onload="alert(1)`, Title: "</title><script>alert(1)</script>"})),
		string(svgchart.Latency(nil, svgchart.Options{ID: `x" onload="alert(1)`, Desc: "<desc>"})),
	} {
		els := elements(t, svg)
		if got := attr(els[0], "aria-labelledby"); got != "xonloadalert1-title xonloadalert1-desc" {
			t.Errorf("id not sanitised: %q", got)
		}
		for _, e := range els {
			if e.Name.Local == "script" {
				t.Errorf("script injected:\n%s", svg)
			}
		}
	}
}
