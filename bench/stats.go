package main

import (
	"math"
	"slices"
	"time"
)

// percentile returns the q-quantile (0..1) of xs by nearest rank; NaN when
// xs is empty. xs is sorted in place.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

func maxOf(xs []float64) float64 {
	m := math.NaN()
	for _, x := range xs {
		if math.IsNaN(m) || x > m {
			m = x
		}
	}
	return m
}

// median of the values that are not NaN; NaN if there are none.
func median(xs []float64) float64 {
	var ys []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			ys = append(ys, x)
		}
	}
	if len(ys) == 0 {
		return math.NaN()
	}
	slices.Sort(ys)
	n := len(ys)
	if n%2 == 1 {
		return ys[n/2]
	}
	return (ys[n/2-1] + ys[n/2]) / 2
}

// jain is Jain's fairness index of xs: (sum x)^2 / (n * sum x^2), 1 when
// all are equal, 1/n when one takes everything.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return math.NaN()
	}
	return s * s / (float64(len(xs)) * s2)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
