package redsem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/failpoint"
)

// Lease is a held token of a Semaphore, or k of them from AcquireN, or a
// read or write hold of an RWMutex. It is immutable but for its deadline,
// and safe for concurrent use. The tokens of a lease share one fence and one
// deadline, and Release and Refresh act on all of them at once.
//
// A lease ends when it is released, when its local deadline passes without a
// refresh, or when Refresh learns that Redis no longer records it. Done is
// closed then and Err says why. The local deadline is computed from Redis
// TIME and this process's monotonic clock so that it never falls after the
// deadline Redis enforces (less a margin of 1% of the TTL plus 2ms); a
// holder that checks Valid or Done before acting never acts after its token
// could have been handed to someone else, unless its machine was suspended
// (the monotonic clock stops in suspend).
type Lease struct {
	sem    *Semaphore
	acqID  string
	token  string   // tokens[0]
	tokens []string // every token held, in grant order
	fence  int64

	ctx       context.Context
	end       context.CancelCauseFunc
	stop      context.CancelFunc // stops auto-refresh
	refreshed <-chan struct{}    // closed once auto-refresh has stopped (at once without it)

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time
	timer    engine.Timer
	final    error // set once Release or Refresh learnt the lease is over
	failed   int   // refreshes that failed since the last that did not
	lastErr  error // the last of those failures
	flights  []*refreshFlight
	auto     autoRefresh // with mu

	relMu   sync.Mutex      // serialises Release
	relNext int             // with relMu: the first token a Release has not given back yet (by chunks)
	relN    int             // with relMu: how many of those before relNext Redis gave back
	stopCtx context.Context // ends when Release stops auto-refresh
	// clk is engine.Clk when the lease was granted: its timers and the
	// goroutines they start never read the package variable again (the
	// explorer swaps it between runs).
	clk engine.Clock
}

// newLease is the lease of acquisition acq granted by r (one token or
// more, a fence, a server deadline) to a request sent at sentUs.
func (s *Semaphore) newLease(acq string, r engine.Reply, sentUs int64) *Lease {
	deadlineMs := r.DeadlineMs
	l := &Lease{sem: s, acqID: acq, token: r.Tokens[0], tokens: r.Tokens, fence: r.Fence, ttl: s.cfg.ttl, clk: engine.Clk}
	l.ctx, l.end = context.WithCancelCause(context.Background())
	stopCtx, stop := context.WithCancel(context.Background())
	l.stop, l.refreshed = stop, closedCh
	l.deadline = s.offset.localDeadline(deadlineMs, s.cfg.ttl, sentUs)
	l.timer = l.clk.AfterFunc(l.deadline.Sub(l.clk.Now()), func() { l.end(l.expired()) })
	l.stopCtx = stopCtx
	return l
}

// use starts auto-refresh (unless WithFixedTTL) for a lease the caller
// hands out. A grant that is stale on arrival is given back without it: a
// refresh racing that release could find the server's deadline passed and
// mark the lease lost, and the release would then never be sent.
func (l *Lease) use() *Lease {
	if !l.sem.cfg.fixedTTL {
		stopped := make(chan struct{})
		l.refreshed = stopped
		l.mu.Lock()
		l.auto.stopped = stopped
		l.armLocked(l.refreshDueLocked())
		l.mu.Unlock()
	}
	return l
}

// Token returns the token this lease holds, e.g. "3f2a9c0d41be:2". The part
// after the colon is the slot, 1 to Size. For a lease of several tokens
// (AcquireN) it is the first of Tokens. An RWMutex lease's is
// "<epoch>:r" (read) or "<epoch>:w" (write).
func (l *Lease) Token() string {
	if l == nil {
		return ""
	}
	return l.token
}

// Tokens returns every token this lease holds: one for Acquire, k for
// AcquireN(ctx, k), each a distinct slot. The slice is a copy.
func (l *Lease) Tokens() []string {
	if l == nil {
		return nil
	}
	return append([]string(nil), l.tokens...)
}

// leaseKind is what differs between the leases of a Semaphore and of an
// RWMutex: the scripts that release and refresh them, and the keys those
// take. Both take the token, the acquisition id, then the script's own
// arguments, and reply alike (release: how many tokens went back; refresh:
// {ok, deadlineMs, nowUs}), so Release and Refresh are written once. The
// scripts are read through their variables when a lease uses them (the
// explorer's tests swap one in for an old version).
type leaseKind struct {
	what    string // "semaphore" or "rwmutex", for errors
	release *engine.Declared[engine.ReleaseArgs]
	refresh *engine.Declared[engine.RefreshArgs]
	keys    func(k keys) []interface{}
}

var semaphoreLeases = &leaseKind{what: "semaphore", release: &engine.Release, refresh: &engine.Refresh,
	keys: func(k keys) []interface{} { return k.all(4) }}

// leaseKind is the kind of the leases s grants.
func (s *Semaphore) leaseKind() *leaseKind {
	if s.kind == nil {
		return semaphoreLeases
	}
	return s.kind
}

// releaseCall is the release of toks, one or more of the lease's tokens
// (release.lua; rw_release.lua for an RWMutex's lease, of one token).
func (l *Lease) releaseCall(toks []string) engine.Run {
	kind := l.sem.leaseKind()
	return kind.release.With(kind.keys(l.sem.k), engine.ReleaseArgs{Token: toks[0], AcqID: l.acqID, Others: toks[1:]})
}

// releaseChunk is the most tokens one run of release.lua gives back, and
// refreshChunk the most one run of refresh.lua extends: a lease of more is
// released or refreshed by several runs, one after another, so that no run
// holds Redis for long (about 1.5µs a token).
const (
	releaseChunk = 256
	refreshChunk = 256
)

// Fence returns the fencing token of this acquisition, greater than every
// earlier acquisition's: pass it with each write to the guarded resource and
// have the resource refuse a lower one. Fences are Redis TIME in µs, or the
// last fence plus one if larger.
func (l *Lease) Fence() int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// Deadline returns the local time after which the lease must be considered
// lost unless refreshed.
func (l *Lease) Deadline() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Valid reports whether the lease is still held: not released, not lost, and
// its deadline not passed. It reads the clock itself instead of trusting a
// timer that may not have fired yet after the process was stopped.
func (l *Lease) Valid() bool {
	if l == nil || l.ctx.Err() != nil {
		return false
	}
	return l.clk.Now().Before(l.Deadline())
}

// Done returns a channel that is closed when the lease ends: released,
// expired, or found lost.
func (l *Lease) Done() <-chan struct{} {
	if l == nil {
		return closedCh
	}
	return l.ctx.Done()
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Err returns nil while the lease is held, and afterwards why it ended:
// ErrReleased, ErrLeaseExpired (with the error of the last refresh, if
// refreshes failed before), ErrLeaseLost, or the error of a Release that
// failed (the lease ends on this side then, its tokens given back or not).
func (l *Lease) Err() error {
	if l == nil {
		return ErrLeaseLost
	}
	if l.ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(l.ctx)
	var rf *releaseFailedError
	if err := l.finalErr(); err != nil && errors.As(cause, &rf) {
		// Ended by a Release whose outcome was unknown; a later Release
		// or Refresh said how it ended.
		return err
	}
	return cause
}

// Context returns a context that is cancelled when the lease ends;
// context.Cause reports why. Derive the work's context from it, or use
// context.AfterFunc to tie it to one of your own.
func (l *Lease) Context() context.Context {
	if l == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrLeaseLost)
		return ctx
	}
	return l.ctx
}

// Release gives the lease's tokens back, if Redis still records the lease:
// then it returns nil; ErrReleased if it was released already, ErrLeaseLost
// if its tokens were reclaimed. It ignores ctx's end (so `defer
// l.Release(ctx)` works) and is bounded by a timeout of its own (5s). It
// stops auto-refresh; after a connection error the lease ends on this side
// all the same. Calling it again is safe (docs/design.md, Leases).
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return ErrLeaseLost
	}
	l.stopAutoRefresh()
	l.relMu.Lock()
	defer l.relMu.Unlock()
	if err := l.finalErr(); err != nil {
		return err
	}
	ctx, cancel := engine.Within(ctx, releaseTimeout)
	defer cancel()
	s := l.sem
	failpoint.Hit("release.sent") // a fault test's hook; a no-op in production
	for l.relNext < len(l.tokens) {
		chunk := l.tokens[l.relNext:min(l.relNext+releaseChunk, len(l.tokens))]
		v, retried, err := engine.Call(ctx, s.pool, l.releaseCall(chunk))
		m, err := redis.Int(v, err)
		if err != nil {
			if l.relNext > 0 || retried || !engine.IsRedisError(err) {
				// Tokens went back, or may have (a lost reply, even if the
				// retry got an error reply): Redis may grant them to
				// others, so the holder holds no more. Only an error reply
				// to the first run's only attempt changed nothing.
				err = s.scriptError("release", err)
				l.end(&releaseFailedError{err})
				return err
			}
			return s.scriptError("release", err)
		}
		if m == 0 && retried && l.clk.Now().Before(l.Deadline()) {
			// After a retry on a fresh connection, a lease whose deadline
			// has not passed can only be missing because the first attempt
			// released it, or because Redis lost the semaphore (a restart
			// without persistence) and maybe made it afresh, with another
			// epoch.
			same, err := l.sameEpoch(ctx)
			if err != nil {
				err = s.scriptError("release", err)
				l.end(&releaseFailedError{err}) // the first attempt likely released it
				return err
			}
			if same {
				m = len(chunk)
			}
		}
		l.relNext += len(chunk)
		l.relN += m
	}
	if l.relN != len(l.tokens) {
		return l.lost()
	}
	l.finish(ErrReleased)
	return nil
}

// giveBack gives back, best effort, the tokens of a lease that ended during
// a refresh of several runs and that Redis still records for it
// (release.lua is owner-checked: a token that went to someone else is left
// alone). It does not stop auto-refresh, so a refresh may call it; a later
// Release goes on from where it stopped.
func (l *Lease) giveBack(ctx context.Context) {
	l.relMu.Lock()
	defer l.relMu.Unlock()
	ctx, cancel := engine.Within(ctx, releaseTimeout)
	defer cancel()
	s := l.sem
	for l.relNext < len(l.tokens) {
		chunk := l.tokens[l.relNext:min(l.relNext+releaseChunk, len(l.tokens))]
		v, _, err := engine.Call(ctx, s.pool, l.releaseCall(chunk))
		m, err := redis.Int(v, err)
		if err != nil {
			return // what is left expires at its deadline
		}
		l.relNext += len(chunk)
		l.relN += m
	}
}

// sameEpoch reports whether the semaphore in Redis is the one this lease was
// granted by: its meta record exists and holds the epoch of the lease's
// tokens ("<epoch>:<slot>").
func (l *Lease) sameEpoch(ctx context.Context) (bool, error) {
	conn, err := l.sem.pool.GetContext(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	stored, err := redis.String(redis.DoContext(conn, ctx, "HGET", l.sem.k.meta, "gen"))
	if errors.Is(err, redis.ErrNil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	epoch, _, _ := strings.Cut(l.token, ":")
	return stored == epoch, nil
}

// Refresh extends the lease to ttl from now, by Redis time, or fails and
// extends nothing: ErrLeaseLost once Redis no longer records it,
// ErrLeaseExpired once its local deadline has passed, ErrReleased after
// Release (after a Release that failed, Err's cause), ErrInvalidTTL for a
// ttl outside MinTTL..MaxTTL. It never revives
// an expired lease, and may run beside another Refresh (see
// docs/design.md, Leases).
func (l *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return ErrLeaseLost
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	if err := l.finalErr(); err != nil {
		return err
	}
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	if !l.Valid() {
		// Past its local deadline, its timer not fired yet: Redis may have
		// expired it already.
		l.end(l.expired())
		return context.Cause(l.ctx)
	}
	s := l.sem
	sent := monoNow()
	f := l.startRefresh(sent, ttl)
	refresh := *s.leaseKind().refresh
	var deadlineMs int64
	for i := 0; i < len(l.tokens); i += refreshChunk {
		if i > 0 {
			// Ended between two runs (released, found lost, or past its
			// local deadline): extend no more of it, and give back what
			// the runs before extended, unless a Release is doing so.
			if err := l.finalErr(); err != nil {
				l.endRefresh(f)
				return err
			}
			if !l.Valid() {
				// Past its local deadline: ended, even if its timer has
				// not fired yet (Redis may have expired it already).
				l.end(l.expired())
			}
			if l.ctx.Err() != nil {
				l.endRefresh(f)
				l.giveBack(ctx)
				return context.Cause(l.ctx)
			}
		}
		chunk := l.tokens[i:min(i+refreshChunk, len(l.tokens))]
		v, _, err := engine.Call(ctx, s.pool, refresh.With(s.leaseKind().keys(s.k),
			engine.RefreshArgs{Token: chunk[0], AcqID: l.acqID, TTLMs: ttl.Milliseconds(), Others: chunk[1:]}))
		vals, err := redis.Int64s(v, err)
		if err != nil {
			// Runs before this one may have extended part of the lease:
			// the local deadline, lowered by startRefresh, is still safe.
			err = s.scriptError("refresh", err)
			l.mu.Lock()
			l.failed, l.lastErr = l.failed+1, err
			l.mu.Unlock()
			l.endRefresh(f)
			return err
		}
		s.offset.observe(sent, vals[2])
		if vals[0] != 1 {
			l.endRefresh(f)
			err := l.lost()
			if i > 0 {
				l.giveBack(ctx)
			}
			return err
		}
		if i == 0 || vals[1] < deadlineMs {
			// The earliest of the runs' deadlines: a later run's Redis
			// TIME may be behind (a clock stepped back, another node).
			deadlineMs = vals[1]
		}
	}
	failpoint.Hit("refresh.replied")
	// The flight ends under the same lock that applies its deadline: a
	// refresh that starts and ends between the two would otherwise not
	// count as overlapping this one, and this (older) reply could raise the
	// deadline over the one Redis now enforces.
	l.mu.Lock()
	defer l.mu.Unlock()
	overlapped := l.endRefreshLocked(f)
	if l.final != nil || l.ctx.Err() != nil {
		// Released or expired while the refresh was on the wire.
		if l.final != nil {
			return l.final
		}
		return context.Cause(l.ctx)
	}
	l.ttl, l.failed, l.lastErr = ttl, 0, nil
	dl := s.offset.localDeadline(deadlineMs, ttl, sent)
	if overlapped && dl.After(l.deadline) {
		// Another refresh was on the wire too, and Redis may have run it
		// after this one: keep the earlier deadline.
		dl = l.deadline
	}
	l.setDeadline(dl)
	return nil
}

// refreshFlight is one Refresh on the wire.
type refreshFlight struct{ overlapped bool }

// startRefresh registers a Refresh sent at sentUs with ttl. Whatever its
// outcome, Redis may run it: so the local deadline drops at once to the
// earliest the new server deadline can be (never raised here). A reply
// lost on the wire then leaves a deadline that is still safe.
func (l *Lease) startRefresh(sentUs int64, ttl time.Duration) *refreshFlight {
	f := &refreshFlight{}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.flights) > 0 {
		f.overlapped = true
		for _, o := range l.flights {
			o.overlapped = true
		}
	}
	l.flights = append(l.flights, f)
	if worst := monoTime(sentUs + ttl.Microseconds() - leaseMargin(ttl)); worst.Before(l.deadline) && l.final == nil {
		l.setDeadline(worst)
	}
	return f
}

// endRefresh unregisters f and reports whether another Refresh was on the
// wire at any time during its flight.
func (l *Lease) endRefresh(f *refreshFlight) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endRefreshLocked(f)
}

// endRefreshLocked is endRefresh with l.mu held.
func (l *Lease) endRefreshLocked(f *refreshFlight) bool {
	for i, o := range l.flights {
		if o == f {
			l.flights = append(l.flights[:i], l.flights[i+1:]...)
			break
		}
	}
	return f.overlapped
}

// setDeadline moves the local deadline and its timer (l.mu held).
func (l *Lease) setDeadline(dl time.Time) {
	l.deadline = dl
	l.timer.Reset(dl.Sub(l.clk.Now()))
}

// releaseTimeout bounds a Release, whatever the caller's context.
const releaseTimeout = 5 * time.Second

// expired is the cause of a lease whose local deadline passed:
// ErrLeaseExpired, with the last refresh's error if refreshes failed.
func (l *Lease) expired() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastErr == nil {
		return ErrLeaseExpired
	}
	return &expiredError{failed: l.failed, last: l.lastErr}
}

// expiredError is ErrLeaseExpired after failed refreshes: errors.Is
// matches ErrLeaseExpired and the last refresh's error.
type expiredError struct {
	failed int
	last   error
}

func (e *expiredError) Error() string {
	return fmt.Sprintf("%v after %d failed refreshes, the last: %s", ErrLeaseExpired, e.failed,
		strings.TrimPrefix(e.last.Error(), "redsem: "))
}

func (e *expiredError) Unwrap() []error { return []error{ErrLeaseExpired, e.last} }

// releaseFailedError is the cause of a lease that a failed Release ended
// on this side: Redis may have given its tokens back, or not yet.
type releaseFailedError struct{ err error }

func (e *releaseFailedError) Error() string {
	return "redsem: lease ended, Release failed: " + strings.TrimPrefix(e.err.Error(), "redsem: ")
}

func (e *releaseFailedError) Unwrap() error { return e.err }

func (l *Lease) finalErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.final
}

func (l *Lease) finish(cause error) {
	l.mu.Lock()
	if l.final == nil {
		l.final = cause
	}
	l.timer.Stop()
	l.disarmLocked()
	l.mu.Unlock()
	l.end(cause)
	l.stop()
}

func (l *Lease) lost() error {
	l.finish(ErrLeaseLost)
	if len(l.tokens) > 1 {
		return fmt.Errorf("%w: semaphore %q, tokens %s", ErrLeaseLost, engine.Printable(l.sem.name), strings.Join(l.tokens, " "))
	}
	return fmt.Errorf("%w: %s %q, token %s", ErrLeaseLost, l.sem.leaseKind().what, engine.Printable(l.sem.name), l.token)
}

// Auto-refresh refreshes the lease each time a third of its TTL has passed,
// until Release stops it or the lease ends. A failed refresh is retried
// every tenth of the TTL (at most every second) while the lease lasts. It
// is a timer (engine.Clk.AfterFunc), not a goroutine per lease: when it
// fires, a goroutine (engine.Clk.Go: the explorer's virtual timers call
// back in line) runs one refresh and arms the next. A refresh already due
// starts at once, without a timer.
type autoRefresh struct {
	timer   engine.Timer  // the next refresh, if armed
	running bool          // a refresh is under way
	stopped chan struct{} // Lease.refreshed: closed once it will never run again
	done    bool          // stopped is closed
}

// refreshDueLocked is how long from now the next refresh is due (l.mu held).
func (l *Lease) refreshDueLocked() time.Duration {
	return l.deadline.Sub(l.clk.Now()) - 2*l.ttl/3
}

// armLocked schedules a refresh in d, or stops auto-refresh if Release
// stopped it or the lease ended (l.mu held).
func (l *Lease) armLocked(d time.Duration) {
	if l.stopCtx.Err() != nil || l.ctx.Err() != nil {
		l.autoStoppedLocked()
		return
	}
	if d <= 0 {
		l.auto.running = true
		ttl := l.ttl
		l.clk.Go(func() { l.refreshOnce(ttl) })
		return
	}
	l.auto.timer = l.clk.AfterFunc(d, func() { l.clk.Go(l.refreshNow) })
}

// disarmLocked stops auto-refresh if it waits on its timer; a refresh
// under way, or one whose timer just fired, stops by itself (l.mu held).
func (l *Lease) disarmLocked() {
	if a := &l.auto; a.stopped != nil && !a.done && !a.running && a.timer.Stop() {
		l.autoStoppedLocked()
	}
}

func (l *Lease) autoStoppedLocked() {
	if !l.auto.done {
		l.auto.done = true
		close(l.auto.stopped)
	}
}

// refreshNow is the timer's: one refresh, unless stopped meanwhile.
func (l *Lease) refreshNow() {
	l.mu.Lock()
	if l.stopCtx.Err() != nil || l.ctx.Err() != nil {
		l.autoStoppedLocked()
		l.mu.Unlock()
		return
	}
	l.auto.running = true
	ttl := l.ttl
	l.mu.Unlock()
	l.refreshOnce(ttl)
}

// refreshOnce runs one refresh (auto.running set), then arms the next.
func (l *Lease) refreshOnce(ttl time.Duration) {
	rctx, cancel := context.WithTimeout(l.stopCtx, ttl/3+time.Second)
	err := l.Refresh(rctx, ttl)
	cancel()
	again := time.Duration(-1) // -1: stop
	switch {
	case err == nil:
		again = 0 // when due
	case errors.Is(err, ErrReleased), errors.Is(err, ErrLeaseExpired):
	case errors.Is(err, ErrLeaseLost):
		l.observeRefreshFailed(err)
	default:
		if l.stopCtx.Err() == nil {
			l.observeRefreshFailed(err) // not one that Release cut short
		}
		again = min(ttl/10, time.Second)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.auto.running = false
	switch again {
	case -1:
		l.autoStoppedLocked()
	case 0:
		l.armLocked(l.refreshDueLocked())
	default:
		// Not before the next refresh falls due (a user's Refresh may
		// have succeeded meanwhile).
		l.armLocked(max(again, l.refreshDueLocked()))
	}
}

// stopAutoRefresh stops auto-refresh and waits for a refresh under way to
// end, so that none runs once it returns.
func (l *Lease) stopAutoRefresh() {
	l.stop()
	l.mu.Lock()
	l.disarmLocked()
	l.mu.Unlock()
	// A refresh under way ends at once (its context is stopCtx), as does
	// one whose timer just fired, and closes refreshed.
	l.clk.WaitOrDone(context.Background(), l.refreshed, engine.Forever)
}

// Local deadlines. Leases are timed by Redis TIME, never by a client's
// wall clock (docs/failure-modes.md, FM-17).
// A client still needs to know, on its own clock, when a lease stops being
// safe to rely on. serverOffset keeps a lower bound of the offset between this
// process's monotonic clock and Redis TIME, learnt from replies: a reply
// carrying server time S to a request sent at local time L proves
// offset = local - server >= L - S, because the server read S after L. A
// server deadline D then passes no earlier than local time D + offset.

// monoBase anchors the process's monotonic clock.
var monoBase = time.Now()

func monoNow() int64 { return monoUs(engine.Clk.Now()) }

// monoUs is t (read from engine.Clk) on the process's monotonic clock, in µs.
func monoUs(t time.Time) int64 { return t.Sub(monoBase).Microseconds() }

func monoTime(us int64) time.Time { return monoBase.Add(time.Duration(us) * time.Microsecond) }

// driftPPM allows the two clocks to run at different rates: an old sample's
// bound is lowered by this much per microsecond of its age.
const driftPPM = 100

type serverOffset struct {
	mu   sync.Mutex
	have bool
	off  int64 // µs, local - server lower bound, as of at
	at   int64 // local µs of the sample
}

// observeReply records that a request sent at sent (engine.Clk) was answered with
// server time nowUs: every acquisition script's reply (engine.Driver.Observe).
func (c *serverOffset) observeReply(sent time.Time, nowUs int64) { c.observe(monoUs(sent), nowUs) }

// observe records that a request sent at local time sentUs was answered with
// server time srvUs.
func (c *serverOffset) observe(sentUs, srvUs int64) {
	cand := sentUs - srvUs
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have || cand > c.boundAt(sentUs) {
		c.have, c.off, c.at = true, cand, sentUs
	}
}

func (c *serverOffset) boundAt(nowUs int64) int64 {
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
func (c *serverOffset) localDeadline(deadlineMs int64, ttl time.Duration, sentUs int64) time.Time {
	margin := leaseMargin(ttl)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have {
		return monoTime(sentUs + ttl.Microseconds() - margin)
	}
	return monoTime(deadlineMs*1000 + c.boundAt(monoNow()) - margin)
}
