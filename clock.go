package redsem

import (
	"sync"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

// Leases are timed by Redis TIME, never by a client's wall clock (FM-17).
// A client still needs to know, on its own clock, when a lease stops being
// safe to rely on. serverClock keeps a lower bound of the offset between this
// process's monotonic clock and Redis TIME, learnt from replies: a reply
// carrying server time S to a request sent at local time L proves
// offset = local - server >= L - S, because the server read S after L. A
// server deadline D then passes no earlier than local time D + offset.

// monoBase anchors the process's monotonic clock.
var monoBase = time.Now()

func monoNow() int64 { return monoUs(clk.Now()) }

// monoUs is t (read from clk) on the process's monotonic clock, in µs.
func monoUs(t time.Time) int64 { return t.Sub(monoBase).Microseconds() }

func monoTime(us int64) time.Time { return monoBase.Add(time.Duration(us) * time.Microsecond) }

// driftPPM allows the two clocks to run at different rates: an old sample's
// bound is lowered by this much per microsecond of its age.
const driftPPM = 100

type serverClock struct {
	mu   sync.Mutex
	have bool
	off  int64 // µs, local - server lower bound, as of at
	at   int64 // local µs of the sample
}

// observe records that a request sent at local time sentUs was answered with
// server time srvUs.
func (c *serverClock) observe(sentUs, srvUs int64) {
	cand := sentUs - srvUs
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have || cand > c.boundAt(sentUs) {
		c.have, c.off, c.at = true, cand, sentUs
	}
}

func (c *serverClock) boundAt(nowUs int64) int64 {
	age := nowUs - c.at
	if age < 0 {
		age = 0
	}
	return c.off - age*driftPPM/1_000_000
}

// leaseMargin is the safety margin of a local deadline, in µs: 1% of the
// TTL plus 2ms, for clock rate differences over the lease.
func leaseMargin(ttl time.Duration) int64 { return (ttl / 100).Microseconds() + 2000 }

// localDeadline maps a server deadline (ms of Redis TIME) to the earliest
// local time at which it may pass, less a safety margin of 1% of ttl plus
// 2ms for clock rate differences over the lease. sentUs is when the request
// that produced the deadline was sent; it bounds the result when no sample
// exists.
func (c *serverClock) localDeadline(deadlineMs int64, ttl time.Duration, sentUs int64) time.Time {
	margin := leaseMargin(ttl)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have {
		return monoTime(sentUs + ttl.Microseconds() - margin)
	}
	return monoTime(deadlineMs*1000 + c.boundAt(monoNow()) - margin)
}

// clk is the time source of every acquisition and lease of this process
// (engine.Clock); the explorer's tests swap in a virtual one.
var clk engine.Clock = engine.RealClock{}
