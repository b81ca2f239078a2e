// Package svgchart draws the endpoint health charts of the merchant portal
// and the operator UI as inline SVG, rendered on the server: no
// JavaScript, no external resource, nothing a strict Content-Security-Policy
// refuses. Colours are presentation attributes (fill, stroke), which CSP
// does not govern, and every element carries a class name so a stylesheet
// can restyle it; there is no style attribute. Each chart has a <title> and
// <desc> (referenced by aria-labelledby) and each bar or point a <title>,
// so screen readers and hover tooltips get the numbers.
package svgchart

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/outbox"
)

// Options label a chart. Every string is escaped.
type Options struct {
	// ID prefixes the ids of the chart's <title> and <desc>; it must be
	// unique on the page (letters, digits, - and _; anything else is
	// dropped). Empty means "chart".
	ID string
	// Title and Desc are the chart's accessible name and description, in
	// the page's language.
	Title, Desc string
	// Width and Height are the drawing's size in CSS pixels; default 480
	// by 160. The SVG scales to its container (viewBox).
	Width, Height int
	// TimeFormat formats bucket start times in the axis labels and
	// tooltips; default "15:04" (use "01-02 15:04" for several days).
	TimeFormat string
	// Location is the time zone of the labels; nil means UTC.
	Location *time.Location
	// NoData labels a bucket without attempts in its tooltip; default
	// "no attempts".
	NoData string
	// P50 and P99 name the latency lines in the legend; default "p50" and
	// "p99".
	P50, P99 string
}

func (o Options) withDefaults() Options {
	if o.Width <= 0 {
		o.Width = 480
	}
	if o.Height <= 0 {
		o.Height = 160
	}
	if o.TimeFormat == "" {
		o.TimeFormat = "15:04"
	}
	if o.Location == nil {
		o.Location = time.UTC
	}
	if o.NoData == "" {
		o.NoData = "no attempts"
	}
	if o.P50 == "" {
		o.P50 = "p50"
	}
	if o.P99 == "" {
		o.P99 = "p99"
	}
	var id strings.Builder
	for _, c := range o.ID {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			id.WriteRune(c)
		}
	}
	if o.ID = id.String(); o.ID == "" {
		o.ID = "chart"
	}
	return o
}

// Layout margins: room for the y labels on the left and the time labels
// below.
const (
	marginLeft   = 44
	marginRight  = 8
	marginTop    = 8
	marginBottom = 22
)

// Colours, as presentation attributes; a stylesheet overrides them through
// the class names.
const (
	colorOK    = "#2e7d32" // success rate ≥ 99 %
	colorWarn  = "#f9a825" // ≥ 90 %
	colorBad   = "#c62828" // below
	colorEmpty = "#bdbdbd"
	colorAxis  = "#757575"
	colorGrid  = "#e0e0e0"
	colorP50   = "#1565c0"
	colorP99   = "#6a1b9a"
)

type canvas struct {
	o          Options
	b          strings.Builder
	x0, y0     float64 // plot origin (bottom left)
	plotW, plh float64
}

func newCanvas(o Options, class string) *canvas {
	c := &canvas{o: o}
	c.x0, c.y0 = marginLeft, float64(o.Height-marginBottom)
	c.plotW, c.plh = float64(o.Width-marginLeft-marginRight), float64(o.Height-marginTop-marginBottom)
	fmt.Fprintf(&c.b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart %s" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="%s-title %s-desc">`,
		class, o.Width, o.Height, o.Width, o.Height, o.ID, o.ID)
	fmt.Fprintf(&c.b, `<title id="%s-title">%s</title><desc id="%s-desc">%s</desc>`, o.ID, esc(o.Title), o.ID, esc(o.Desc))
	return c
}

func esc(s string) string { return html.EscapeString(s) }

func num(f float64) string { return strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64) }

// gridLine draws a horizontal grid line at fraction f of the plot's height
// with its label.
func (c *canvas) gridLine(f float64, label string) {
	y := c.y0 - f*c.plh
	fmt.Fprintf(&c.b, `<line class="grid" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1"/>`,
		num(c.x0), num(y), num(c.x0+c.plotW), num(y), colorGrid)
	fmt.Fprintf(&c.b, `<text class="label label-y" x="%s" y="%s" text-anchor="end" font-size="10" fill="%s">%s</text>`,
		num(c.x0-4), num(y+3), colorAxis, esc(label))
}

// timeLabels writes up to five evenly spaced time labels under the plot.
func (c *canvas) timeLabels(points []outbox.HealthPoint, xOf func(i int) float64) {
	n := len(points)
	if n == 0 {
		return
	}
	every := max(1, (n+4)/5)
	for i := 0; i < n; i += every {
		fmt.Fprintf(&c.b, `<text class="label label-x" x="%s" y="%s" text-anchor="middle" font-size="10" fill="%s">%s</text>`,
			num(xOf(i)), num(c.y0+14), colorAxis, esc(points[i].Start.In(c.o.Location).Format(c.o.TimeFormat)))
	}
	fmt.Fprintf(&c.b, `<line class="axis" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1"/>`,
		num(c.x0), num(c.y0), num(c.x0+c.plotW), num(c.y0), colorAxis)
}

func (c *canvas) html() template.HTML {
	c.b.WriteString(`</svg>`)
	return template.HTML(c.b.String()) // every string in it went through esc
}

// SuccessRate draws one bar per bucket, as high as the bucket's share of
// attempts that succeeded: green from 99 %, amber from 90 %, red below
// (classes bar-ok, bar-warn, bar-bad); a bucket without attempts is a thin
// grey mark (class bar-empty). Each bar's <title> gives the time, the rate
// and the counts.
func SuccessRate(points []outbox.HealthPoint, o Options) template.HTML {
	o = o.withDefaults()
	c := newCanvas(o, "chart-success")
	for _, f := range []float64{0, 0.5, 1} {
		c.gridLine(f, strconv.Itoa(int(f*100))+"%")
	}
	n := len(points)
	slot := c.plotW / float64(max(n, 1))
	gap := math.Min(2, slot/4)
	xOf := func(i int) float64 { return c.x0 + slot*float64(i) + slot/2 }
	for i, p := range points {
		x := c.x0 + slot*float64(i) + gap/2
		when := p.Start.In(o.Location).Format(o.TimeFormat)
		if p.Attempts == 0 {
			fmt.Fprintf(&c.b, `<rect class="bar bar-empty" x="%s" y="%s" width="%s" height="2" fill="%s"><title>%s: %s</title></rect>`,
				num(x), num(c.y0-2), num(slot-gap), colorEmpty, esc(when), esc(o.NoData))
			continue
		}
		rate := float64(p.Succeeded) / float64(p.Attempts)
		class, color := "bar-bad", colorBad
		switch {
		case rate >= 0.99:
			class, color = "bar-ok", colorOK
		case rate >= 0.9:
			class, color = "bar-warn", colorWarn
		}
		h := math.Max(rate*c.plh, 2) // a failing bucket stays visible
		fmt.Fprintf(&c.b, `<rect class="bar %s" x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s: %s%% (%d/%d)</title></rect>`,
			class, num(x), num(c.y0-h), num(slot-gap), num(h), color, esc(when),
			strconv.FormatFloat(rate*100, 'f', 1, 64), p.Succeeded, p.Attempts)
	}
	c.timeLabels(points, xOf)
	return c.html()
}

// Latency draws the p50 and p99 request durations per bucket as two lines
// (classes line-p50 and line-p99) on a scale from zero to a round value
// above the highest p99, with a point per bucket whose <title> gives both
// values; buckets without a measured request break the lines.
func Latency(points []outbox.HealthPoint, o Options) template.HTML {
	o = o.withDefaults()
	c := newCanvas(o, "chart-latency")
	var top time.Duration
	for _, p := range points {
		top = max(top, p.P99, p.P50)
	}
	scale := niceCeil(top)
	for _, f := range []float64{0, 0.5, 1} {
		c.gridLine(f, formatDuration(time.Duration(f*float64(scale))))
	}
	n := len(points)
	slot := c.plotW / float64(max(n, 1))
	xOf := func(i int) float64 { return c.x0 + slot*float64(i) + slot/2 }
	yOf := func(d time.Duration) float64 { return c.y0 - float64(d)/float64(scale)*c.plh }
	for _, line := range []struct {
		class, color string
		v            func(outbox.HealthPoint) time.Duration
	}{
		{"line-p99", colorP99, func(p outbox.HealthPoint) time.Duration { return p.P99 }},
		{"line-p50", colorP50, func(p outbox.HealthPoint) time.Duration { return p.P50 }},
	} {
		var seg []string
		flush := func() {
			if len(seg) > 0 {
				fmt.Fprintf(&c.b, `<polyline class="line %s" fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`,
					line.class, line.color, strings.Join(seg, " "))
			}
			seg = seg[:0]
		}
		for i, p := range points {
			if p.P50 == 0 && p.P99 == 0 {
				flush()
				continue
			}
			seg = append(seg, num(xOf(i))+","+num(yOf(line.v(p))))
		}
		flush()
	}
	for i, p := range points {
		if p.P50 == 0 && p.P99 == 0 {
			continue
		}
		fmt.Fprintf(&c.b, `<circle class="point" cx="%s" cy="%s" r="2" fill="%s"><title>%s: %s %s, %s %s</title></circle>`,
			num(xOf(i)), num(yOf(p.P99)), colorP99, esc(p.Start.In(o.Location).Format(o.TimeFormat)),
			esc(o.P50), formatDuration(p.P50), esc(o.P99), formatDuration(p.P99))
	}
	// Legend, top right.
	lx := c.x0 + c.plotW - 90
	for i, l := range []struct{ name, class, color string }{{o.P50, "line-p50", colorP50}, {o.P99, "line-p99", colorP99}} {
		x := lx + float64(i)*45
		fmt.Fprintf(&c.b, `<line class="legend %s" x1="%s" y1="%d" x2="%s" y2="%d" stroke="%s" stroke-width="2"/>`,
			l.class, num(x), marginTop+4, num(x+12), marginTop+4, l.color)
		fmt.Fprintf(&c.b, `<text class="label legend-label" x="%s" y="%d" font-size="10" fill="%s">%s</text>`,
			num(x+15), marginTop+7, colorAxis, esc(l.name))
	}
	c.timeLabels(points, xOf)
	return c.html()
}

// niceCeil rounds d up to 1, 2 or 5 times a power of ten milliseconds (at
// least 10 ms), so the scale reads well.
func niceCeil(d time.Duration) time.Duration {
	ms := float64(d) / float64(time.Millisecond)
	if ms <= 10 {
		return 10 * time.Millisecond
	}
	p := math.Pow(10, math.Floor(math.Log10(ms)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= ms {
			return time.Duration(m * p * float64(time.Millisecond))
		}
	}
	return d
}

// formatDuration writes d in ms below a second, in s above.
func formatDuration(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatFloat(math.Round(float64(d)/float64(time.Millisecond)*10)/10, 'f', -1, 64) + " ms"
	}
	return strconv.FormatFloat(math.Round(d.Seconds()*100)/100, 'f', -1, 64) + " s"
}
