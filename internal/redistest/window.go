package redistest

import (
	"fmt"
	"sort"
	"time"
)

// The sliding-window checker of rate gates. A gate promises, for every start
// at grant time t (Redis TIME) that takes units of the limit and with
// (n, per) the rate in force at t, that the units granted in the window
// (t-per, t], this start included, are at most n. The window counts every
// grant in it, those before a change of the rate too, however the change
// moved n or per: with one rate that is "no window of length per holds more
// than n units". A start that takes none of the limit's units is not held
// to it (a quota's start may take units of another limit only).

// Grant is one start as the checker sees it: its grant time and how many
// units of the limit under check it took (1 for a plain start).
type Grant struct {
	At    time.Time
	Units int
}

// Rate is a limit in force from At on: at most N units in any window of
// length Per. The first of a history is the rate the gate was made with
// (its At may be zero); each later one is a change, in force for the grants
// after its At.
type Rate struct {
	At  time.Time
	N   int
	Per time.Duration
}

// WindowViolation is a start whose window held more than the rate in force
// allowed.
type WindowViolation struct {
	At    time.Time // the start's grant time
	From  time.Time // the window is (From, At]
	Units int       // the units granted in it
	Rate  Rate      // the rate in force at At
}

func (v WindowViolation) String() string {
	return fmt.Sprintf("%d units in (%s, %s], limit %d per %v (in force since %s)",
		v.Units, v.From.Format("15:04:05.000000"), v.At.Format("15:04:05.000000"), v.Rate.N, v.Rate.Per,
		v.Rate.At.Format("15:04:05.000000"))
}

// CheckWindows holds grants to the rule above under rates (sorted by At,
// the first one the rate the gate was made with) and returns every start
// whose window held too much, in grant order.
func CheckWindows(grants []Grant, rates []Rate) []WindowViolation {
	if len(rates) == 0 {
		return nil
	}
	gs := append([]Grant(nil), grants...)
	sort.Slice(gs, func(i, j int) bool { return gs[i].At.Before(gs[j].At) })
	// sums[i] is the units of gs[:i].
	sums := make([]int, len(gs)+1)
	for i, g := range gs {
		sums[i+1] = sums[i] + g.Units
	}
	var out []WindowViolation
	r := 0
	for i, g := range gs {
		for r+1 < len(rates) && rates[r+1].At.Before(g.At) {
			r++
		}
		if g.Units == 0 {
			continue
		}
		from := g.At.Add(-rates[r].Per)
		// The first grant after from.
		first := sort.Search(i+1, func(j int) bool { return gs[j].At.After(from) })
		if units := sums[i+1] - sums[first]; units > rates[r].N {
			out = append(out, WindowViolation{At: g.At, From: from, Units: units, Rate: rates[r]})
		}
	}
	return out
}

// MaxUnitsInWindow is the largest total of units among the grants that fall
// in one half-open window [x, x+per), over every x.
func MaxUnitsInWindow(grants []Grant, per time.Duration) int {
	gs := append([]Grant(nil), grants...)
	sort.Slice(gs, func(i, j int) bool { return gs[i].At.Before(gs[j].At) })
	most, sum, i := 0, 0, 0
	for j := range gs {
		sum += gs[j].Units
		for gs[j].At.Sub(gs[i].At) >= per {
			sum -= gs[i].Units
			i++
		}
		most = max(most, sum)
	}
	return most
}

// MaxInWindow is MaxUnitsInWindow of starts of one unit each: the largest
// number of the times that fall in one window [x, x+per).
func MaxInWindow(times []time.Time, per time.Duration) int {
	gs := make([]Grant, len(times))
	for i, t := range times {
		gs[i] = Grant{At: t, Units: 1}
	}
	return MaxUnitsInWindow(gs, per)
}
