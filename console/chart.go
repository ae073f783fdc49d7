package console

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/human"
)

// sparkline draws ys as an SVG polyline with its latest value and peak, on
// the server: no script, no library.
func sparkline(ys []float64, label string) template.HTML {
	const w, h, pad = 600.0, 120.0, 4.0
	if len(ys) < 2 {
		return template.HTML(`<p class="muted">Not enough samples yet for a chart of ` + template.HTMLEscapeString(label) + `: the console samples every few seconds.</p>`)
	}
	hi := 0.0
	for _, y := range ys {
		hi = max(hi, y)
	}
	if hi == 0 {
		hi = 1
	}
	var pts strings.Builder
	for i, y := range ys {
		x := pad + (w-2*pad)*float64(i)/float64(len(ys)-1)
		yy := h - pad - (h-2*pad)*y/hi
		fmt.Fprintf(&pts, "%.1f,%.1f ", x, yy)
	}
	return template.HTML(fmt.Sprintf(`<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s"><title>%s: latest %s, peak %s</title>`+
		`<line class="axis" x1="0" y1="%.0f" x2="%.0f" y2="%.0f"/><polyline points="%s"/></svg>`+
		`<p class="legend">%s: latest <b>%s</b>, peak %s over %d samples</p>`,
		w, h, template.HTMLEscapeString(label), template.HTMLEscapeString(label), num(ys[len(ys)-1]), num(hi),
		h-pad, w, h-pad, strings.TrimSpace(pts.String()),
		template.HTMLEscapeString(label), num(ys[len(ys)-1]), num(hi), len(ys)))
}

func num(f float64) string {
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d", int64(f))
	}
	return fmt.Sprintf("%.1f", f)
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"age": func(d time.Duration) string {
		switch {
		case d <= 0:
			return "-"
		case d < time.Second:
			return d.Round(time.Millisecond).String()
		case d < time.Hour:
			return d.Round(time.Second).String()
		}
		return d.Round(time.Minute).String()
	},
	"ms": func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) },
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"whenp": func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"state": state,
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
	"rate":    func(f float64) string { return fmt.Sprintf("%.1f/s", f) },
	"bytes":   human.Bytes,
	"isState": func(ev core.Event, s string) bool { return state(ev) == s },
}
