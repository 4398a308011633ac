package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// cdfSVG draws the handoff latency CDF of each library on a log time axis,
// as a self-contained SVG with no dependencies.
func cdfSVG(samples map[string][]float64, order []*lib) string {
	const (
		w, h                   = 860, 480
		left, right, top, bott = 70, 190, 40, 60
	)
	pw, ph := float64(w-left-right), float64(h-top-bott)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range samples {
		for _, v := range s {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 1))))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	x := func(v float64) float64 {
		v = math.Max(v, lo)
		return float64(left) + pw*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	y := func(p float64) float64 { return float64(top) + ph*(1-p) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">Handoff latency CDF: release at t0 → waiter holds the lock (log scale)</text>`+"\n", left)
	for d := lo; d <= hi*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := d * m
			if v > hi*1.0001 {
				break
			}
			stroke := "#eee"
			if m == 1 {
				stroke = "#ccc"
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(v), h-bott+18, fmtDur(v))
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`+"\n", x(v), top, x(v), h-bott, stroke)
		}
	}
	for _, p := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ccc"/>`+"\n", left, y(p), w-right, y(p))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, y(p)+4, p)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">time from release to the waiter holding the lock</text>`+"\n", float64(left)+pw/2, h-18)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">fraction of handoffs</text>`+"\n", float64(top)+ph/2)

	colors := []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#e377c2", "#bcbd22"}
	i := 0
	for _, l := range order {
		s, ok := samples[l.name]
		if !ok || len(s) == 0 {
			continue
		}
		s = slices.Clone(s)
		slices.Sort(s)
		col := colors[i%len(colors)]
		width := 1.5
		if l.kind == "redsem" {
			width = 3
		}
		dash := ""
		if l.kind == "floor" {
			dash = ` stroke-dasharray="6 3"`
		}
		var pts strings.Builder
		n := float64(len(s))
		fmt.Fprintf(&pts, "%.1f,%.1f ", x(s[0]), y(0))
		for k, v := range s {
			fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(v), y(float64(k)/n), x(v), y(float64(k+1)/n))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n", col, width, dash, strings.TrimSpace(pts.String()))
		ly := top + 10 + 22*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%.1f"%s/>`+"\n", w-right+12, ly, w-right+36, ly, col, width, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (p50 %s)</text>`+"\n", w-right+42, ly+4, html.EscapeString(l.name), fmtDur(percentile(s, 0.5)))
		i++
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// fmtDur formats microseconds for an axis label.
func fmtDur(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gs", roundSig(v/1e6))
	case v >= 1e3:
		return fmt.Sprintf("%gms", roundSig(v/1e3))
	}
	return fmt.Sprintf("%gµs", roundSig(v))
}

func roundSig(v float64) float64 {
	if v == 0 {
		return 0
	}
	p := math.Pow(10, 2-math.Floor(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}
