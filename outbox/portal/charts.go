package portal

import (
	"html/template"
	"sort"
	"strings"

	"github.com/txhook/txhook/internal/svgchart"
	"github.com/txhook/txhook/outbox"
)

// chartSVG holds an endpoint's two charts over one window, as inline SVG.
type chartSVG struct {
	Rate, Latency template.HTML
}

// charts draws the success rate and the p50/p99 latency of one window
// ("24h" or "7d"), labelled in the page's language.
func (p *Portal) charts(l *locale, window string, pts []outbox.HealthPoint) chartSVG {
	o := svgchart.Options{NoData: l.T("attempts.none"), P50: "p50", P99: "p99"}
	if window == "7d" {
		o.TimeFormat = "01-02 15:04"
	}
	rate, lat := o, o
	rate.ID, rate.Title, rate.Desc = "rate-"+window, l.T("chart.rate"), l.T("chart.rate_desc."+window)
	lat.ID, lat.Title, lat.Desc = "latency-"+window, l.T("chart.latency"), l.T("chart.latency_desc."+window)
	return chartSVG{Rate: svgchart.SuccessRate(pts, rate), Latency: svgchart.Latency(pts, lat)}
}

// requestHeaders renders the headers an attempt was sent with, escaped.
func requestHeaders(l *locale, a outbox.Attempt) template.HTML {
	if len(a.RequestHeaders) == 0 && a.SignatureNote == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString("<p><strong>")
	b.WriteString(template.HTMLEscapeString(l.T("attempt.request")))
	b.WriteString("</strong></p><pre class=\"headers\">")
	names := make([]string, 0, len(a.RequestHeaders))
	for k := range a.RequestHeaders {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range a.RequestHeaders[k] {
			b.WriteString(template.HTMLEscapeString(k + ": " + v))
			b.WriteByte('\n')
		}
	}
	b.WriteString("</pre>")
	if a.SignatureNote != "" {
		b.WriteString(`<p class="muted">`)
		b.WriteString(template.HTMLEscapeString(l.T("attempt.unsigned")))
		b.WriteString("</p>")
	}
	return template.HTML(b.String())
}
