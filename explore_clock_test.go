package redsem

// The server's clock as users' servers have it (scenario.clock): Redis TIME,
// and with it every deadline Redis keeps, the keys' expiry and the block
// timeouts, may stand still for a few steps (a clock that answers one value
// again and again while the clients' time moves on), or step back: a
// failover to a replica whose clock is behind (the explorer has no replica:
// the clock steps back, data kept), or a restart without the data on a host
// whose clock is behind. The
// clients' clock (engine.Clk) goes on meanwhile, so the skew, the server's
// clock less the clients', only falls. A server clock that steps forward
// is out of scope: Redis cannot keep a lease's promise then (the README's
// "A step forward of the Redis host's clock").

import (
	"fmt"
	"time"
)

// clockStall is how many steps a stalled server clock stands still for:
// commands, or time steps, which then pass for the clients only.
const clockStall = 3

// clockBack is how far a step back sets the server's clock: half a TTL, so
// that leases expired by the server's clock come back to life there, and
// new deadlines fall before old ones.
func (r *run) clockBack() time.Duration { return r.sc.ttl / 2 }

// clockFaults are the clock's fault steps the scheduler may choose now (w.mu
// held).
func (r *run) clockFaults() []step {
	back := r.clockBack()
	var out []step
	if r.w.stall == 0 {
		out = append(out, step{label: fmt.Sprintf("server clock stands still for %d steps", clockStall), fault: true,
			apply: func(r *run) { r.stallClock() }})
	}
	out = append(out, step{label: fmt.Sprintf("server clock steps back %v, data kept", back), fault: true,
		apply: func(r *run) { r.clockStepsBack(false) }})
	if r.sc.restart && !r.loss {
		out = append(out, step{label: fmt.Sprintf("server restarts without its data, its clock %v behind", back), fault: true,
			apply: func(r *run) { r.clockStepsBack(true) }})
	}
	return out
}

func (r *run) stallClock() {
	r.faults++
	r.w.mu.Lock()
	r.w.stall = clockStall
	r.chk.skewed = true
	r.w.mu.Unlock()
	r.note(fmt.Sprintf("server clock stands still for %d steps", clockStall))
}

// clockStepsBack sets the server's clock back, after a restart that loses
// the data if lose.
func (r *run) clockStepsBack(lose bool) {
	if lose {
		r.restart()
	} else {
		r.faults++
	}
	back := r.clockBack()
	w := r.w
	w.mu.Lock()
	w.stepBack(back)
	r.chk.skewed = true
	w.mu.Unlock()
	r.note(fmt.Sprintf("server clock steps back %v", back))
}
