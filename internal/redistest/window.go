package redistest

import (
	"sort"
	"time"
)

// MaxInWindow is the sliding-window checker: the largest number of the times
// that fall in one half-open window [x, x+per), over every x. Sorted, that is
// the largest j-i+1 with t[j]-t[i] < per.
func MaxInWindow(times []time.Time, per time.Duration) int {
	ts := append([]time.Time(nil), times...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	most, i := 0, 0
	for j := range ts {
		for ts[j].Sub(ts[i]) >= per {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}
