package redsem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Weighted acquisition: AcquireN and TryAcquireN take k tokens at once.
//
// Only one weighted acquisition of a semaphore at a time may hold tokens
// before it has all it asked for: the holder of the collector ticket (meta
// field "coll", see internal/engine/lua/weighted.lua). The others queue for the ticket in a
// Redis list, first come, first served, each sleeping in BLPOP on a doorbell
// of its own. The collector waits for its first token in the ordinary token
// queue (BLMOVE into its pending list, with the script right behind it in
// the same write); once it holds one, release.lua hands it every released
// token until it has k, and rings its doorbell when it has them all. What it
// holds meanwhile are leases (fence 0) listed in a part list of its own,
// each recorded once, when it arrives: collecting k tokens costs O(k) of
// Redis time in all, and no run of the script takes or seals more than 128
// of them (a larger grant is sealed over several runs, which the script asks
// for by ringing its own doorbell). Every weighted acquisition checks in (runs
// its script) at least every collectPoll; its registration, and the ticket,
// lapse collectGrace after a check-in it missed, whatever the block time:
// the sweep gives back what a dead collector held, and the next weighted
// script hands the ticket on. A collector whose context ends gives them back
// at once (abort_n.lua).

// collectPoll caps how long a weighted acquisition, collecting or queued
// for the ticket, sleeps between runs of its script: how often it checks in.
// Released tokens wake a collector at once; this bounds how late it notices
// tokens that came back another way (reclaimed from an expired lease or a
// cancelled waiter). collectGrace caps the margin past a missed check-in
// (the grace, if shorter) after which it counts as dead: its registration
// lapses, the sweep gives back what it collected, and the next weighted
// request takes the ticket over. So a dead collector's tokens and ticket
// come back within collectPoll plus collectGrace, whatever the block time.
const (
	collectPoll  = 500 * time.Millisecond
	collectGrace = 500 * time.Millisecond
)

// bell is the doorbell a weighted waiter sleeps on (BLPOP).
func (k keys) bell(acqID string) string { return k.base + "bell:" + acqID }

// wqueue is the list of weighted acquisitions waiting for the collector
// ticket, oldest first.
func (k keys) wqueue() string { return k.base + "wqueue" }

// AcquireN blocks until k tokens are free for this caller and returns one
// lease that holds all k (Lease.Tokens), or until ctx ends. It is all or
// nothing: it never returns a lease on fewer tokens, and when it fails it
// holds none. AcquireN(ctx, 1) is Acquire(ctx). k must be between 1 and the
// size (ErrInvalidSize otherwise, before any I/O). Made WithAdoptSize, the
// semaphore checks k against the size stored in Redis instead, and fails
// with ErrInvalidSize when k is more; a shrink (admin's Resize) while a request
// collects retires the tokens it collected above the new size (they are
// dropped, never granted) and it collects others.
//
// # Fairness
//
// The rule is golang.org/x/sync/semaphore's: a request at the head of the
// queue is not overtaken by later, smaller ones, so large requests are not
// starved by a stream of small ones. In Redis it holds as follows.
//
//   - Weighted requests (k > 1) queue for a single collector ticket, first
//     come, first served. Only the ticket's holder collects tokens, so two
//     weighted requests never each hold part of what they need (no
//     deadlock), and the others hold nothing while they wait.
//   - The collector takes the tokens that are free, then waits for the next
//     one in the same Redis queue as Acquire's waiters (first come, first
//     served). Acquire callers already waiting there go first.
//   - Once it holds a token it holds the head of the queue: every token a
//     Release gives back goes to it until it has k, and Acquire and
//     AcquireN callers that come later wait behind it, even though some
//     tokens are with it and not in use.
//   - Not FIFO: a request waiting for the ticket is not in the token queue,
//     so Acquire callers that arrive meanwhile may go before it; x/sync has a
//     single queue for all callers, redsem one for the ticket and Redis's
//     for tokens. A token that comes back other than by Release (reclaimed
//     from an expired lease or a cancelled waiter) goes to the first waiter
//     blocked in Redis, which may want one token; the collector picks up
//     free tokens whenever its script runs, at least every second while it
//     collects.
//
// TryAcquireN, like x/sync's TryAcquire, fails when a weighted request is
// collecting or waiting, even if k tokens are free.
//
// # Failure
//
// When ctx ends, AcquireN returns an error for which errors.Is(err,
// ctx.Err()) holds, and the tokens it had collected go back at once. If the
// process dies while collecting, they come back, and the ticket passes on,
// within about a second (sooner with a grace under half a second,
// WithGrace), whatever the block time. While a request collects,
// admin's Status lists the tokens it has so far as holders with Fence 0; a granted
// lease of k tokens shows as k holders with one fence, strictly greater than
// every earlier fence. Other errors: ErrInvalidSize, *SizeMismatchError,
// ErrWrongType, ErrCorrupt, ErrOutOfMemory, or a connection error.
func (s *Semaphore) AcquireN(ctx context.Context, k int) (*Lease, error) {
	if k == 1 {
		return s.Acquire(ctx)
	}
	start := time.Now()
	if err := s.checkN(k); err != nil {
		return s.observeAcquire(start, nil, err)
	}
	l, err := s.acquireN(ctx, k, true)
	return s.observeAcquire(start, l, err)
}

// TryAcquireN returns a lease on k tokens if k are free now and no weighted
// request is collecting or waiting, and ErrNoToken otherwise; it holds no
// token after a failure. It never waits. Up to 128 tokens it is one round
// trip; a larger k is taken 128 tokens per round trip, so that no script
// holds Redis for long, as the collector of weighted requests: meanwhile
// tokens that others release go to it, and it gives everything back the
// moment it finds too few free.
// TryAcquireN(ctx, 1) is TryAcquire(ctx).
func (s *Semaphore) TryAcquireN(ctx context.Context, k int) (*Lease, error) {
	if k == 1 {
		return s.TryAcquire(ctx)
	}
	start := time.Now()
	if err := s.checkN(k); err != nil {
		return s.observeAcquire(start, nil, err)
	}
	l, err := s.acquireN(ctx, k, false)
	return s.observeAcquire(start, l, err)
}

func (s *Semaphore) checkN(k int) error {
	if s.cfg.adoptSize && k >= 1 && k <= MaxSize {
		return nil // checked against the stored size by the script
	}
	if k < 1 || k > s.size {
		return fmt.Errorf("%w: %d permits of semaphore %q of size %d", ErrInvalidSize, k, printable(s.name), s.size)
	}
	return nil
}

// acquireNReply is a decoded reply of acquire_n.lua or abort_n.lua.
type acquireNReply struct {
	code       int64 // engine.CodeGranted, CodeWaiting (not yet), CodeSettled, CodeReleased
	fence      int64
	deadlineMs int64
	nowUs      int64
	blockMs    int64
	mode       int64 // with code 0: 0 queued, 1 BLMOVE, 2 collecting at the head
	tokens     []string
}

// Wait modes of acquire_n.lua's code 0 reply.
const (
	modeQueued  = 0 // waiting for the ticket: BLPOP on the bell
	modeMove    = 1 // collector without a token: BLMOVE tokens -> pend
	modeCollect = 2 // collector holding tokens: BLPOP on the bell
	modeMore    = 3 // TryAcquireN collecting more than tryStep: run again at once
)

// tryStep is the largest k TryAcquireN takes in one run of acquire_n.lua
// (weighted.lua's STEP): a larger k is collected STEP tokens a run, so that
// no run holds Redis for long.
const tryStep = 128

func parseAcquireNReply(v interface{}, err error) (acquireNReply, error) {
	vals, err := redis.Values(v, err)
	if err != nil {
		return acquireNReply{}, err
	}
	var r acquireNReply
	if len(vals) == 0 {
		return r, fmt.Errorf("unexpected reply %v", vals)
	}
	if r.code, err = redis.Int64(vals[0], nil); err != nil {
		return r, err
	}
	switch {
	case r.code == engine.CodeGranted && len(vals) >= 5:
		_, err = redis.Scan(vals[1:4], &r.fence, &r.deadlineMs, &r.nowUs)
		if err == nil {
			r.tokens, err = redis.Strings(vals[4:], nil)
		}
	case r.code == engine.CodeWaiting && len(vals) == 5:
		var have int64
		_, err = redis.Scan(vals[1:], &r.blockMs, &r.nowUs, &r.mode, &have)
	case len(vals) == 3 && r.code != engine.CodeGranted: // settled, or abort_n.lua's replies

		_, err = redis.Scan(vals[2:], &r.nowUs)
	default:
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	return r, err
}

// acquireNArgs are acquire_n.lua's keys and arguments.
func (s *Semaphore) acquireNArgs(acq string, k int, blockMs int64, phase string) []interface{} {
	return engine.Args(acquireNScript, append(s.k.all(5), s.k.pend(acq), s.k.bell(acq), s.k.wqueue()),
		engine.A("size", s.size), engine.A("acqID", acq), engine.A("k", k), engine.A("ttlMs", s.cfg.ttl.Milliseconds()),
		engine.A("label", s.cfg.label), engine.A("blockMs", blockMs),
		engine.A("graceMs", min(s.cfg.grace, collectGrace).Milliseconds()), engine.A("tombMs", s.tombMs()),
		engine.A("pollMs", collectPoll.Milliseconds()), engine.A("phase", phase),
		engine.A("sizeMode", s.sizeMode()), engine.A("idleMs", s.cfg.idle.Milliseconds()))
}

func (s *Semaphore) acquireN(ctx context.Context, k int, wait bool) (*Lease, error) {
	mode := modeTry
	if wait {
		mode = modeWait
	}
	p := &kTokens{s: s, k: k}
	// A weighted registration lapses collectGrace (or the grace, if
	// shorter) after a missed check-in, not the grace.
	d := s.driver()
	d.Grace = min(s.cfg.grace, collectGrace)
	res, err := engine.Drive[acquireNReply](ctx, d, p, mode, nil)
	switch {
	case err != nil:
		return nil, err
	case res.Granted:
		return p.lease, nil
	}
	return nil, fmt.Errorf("%w: semaphore %q: %d permits", ErrNoToken, printable(s.name), k)
}

// kTokens is the driver's protocol for k tokens at once: acquire_n.lua,
// behind BLMOVE (a collector before its first token) or BLPOP on the
// waiter's doorbell (queued for the ticket, or collecting), and abort_n.lua.
type kTokens struct {
	s     *Semaphore
	k     int
	lease *Lease
	stale int // grants in a row that were unusable on arrival
}

// First runs acquire_n.lua's first run. A TryAcquireN of more than
// tryStep tokens runs it again ("more") on the same connection until it
// grants or refuses; one whose later run failed with an error reply gives
// back what it collected before it returns the error (the driver settles
// only waits, and a failed first run holds nothing).
func (p *kTokens) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (acquireNReply, error) {
	r, err := parseAcquireNReply(runScript(ctx, conn, acquireNScript, p.s.acquireNArgs(acq, p.k, block.Milliseconds(), "fresh")...))
	for err == nil && block == 0 && r.code == engine.CodeWaiting && r.mode == modeMore {
		r, err = parseAcquireNReply(runScript(ctx, conn, acquireNScript, p.s.acquireNArgs(acq, p.k, 0, "more")...))
		switch {
		case err != nil && engine.IsRedisError(err):
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engine.SettleTimeout)
			_, _ = p.s.abortN(actx, acq, p.k, "release")
			cancel()
		case err == nil && r.code == engine.CodeSettled:
			// It lost the ticket between two runs: refused, nothing held.
			r.code = engine.CodeWaiting
		}
	}
	return r, err
}

// Wait writes the wait r asks for (BLMOVE into the pending list, or BLPOP
// on the doorbell) and acquire_n.lua in one write, so that the script runs
// on the server the moment the wait ends.
func (p *kTokens) Wait(ctx context.Context, conn redis.Conn, acq string, r acquireNReply, next time.Duration) (acquireNReply, error) {
	s := p.s
	wait := engine.BLPOP(s.k.bell(acq))
	if r.mode == modeMove {
		wait = engine.BLMOVE(s.k.tokens, s.k.pend(acq))
	}
	return parseAcquireNReply(engine.BlockThenRun(ctx, conn, p.Block(r), wait,
		acquireNScript, s.acquireNArgs(acq, p.k, next.Milliseconds(), "wait"), p.Error))
}

func (p *kTokens) Abort(ctx context.Context, acq, mode string) (acquireNReply, error) {
	return p.s.abortN(ctx, acq, p.k, mode)
}

func (p *kTokens) Code(r acquireNReply) int64 { return r.code }

func (p *kTokens) Block(r acquireNReply) time.Duration {
	return time.Duration(r.blockMs) * time.Millisecond
}

func (p *kTokens) Moves(r acquireNReply) bool { return r.mode == modeMove }

func (p *kTokens) Observe(r acquireNReply, sent time.Time) {
	p.s.clock.observe(monoUs(sent), r.nowUs)
	if r.code == engine.CodeWaiting {
		p.stale = 0
	}
}

// Accept takes a grant, unless it is older than its lease allows (this
// process was frozen, or the TTL is shorter than a round trip): such a grant
// is given back, bounded as a cancelled wait's settling is, and the
// acquisition starts over, but not forever.
func (p *kTokens) Accept(ctx context.Context, acq string, r acquireNReply, sent time.Time) (bool, error) {
	s := p.s
	l := s.newLeaseN(acq, r.tokens, r.fence, r.deadlineMs, monoUs(sent))
	if l.Valid() {
		p.lease = l.use()
		return true, nil
	}
	s.giveBack(ctx, l)
	if p.stale++; p.stale >= maxStaleGrants {
		return false, fmt.Errorf("%w: semaphore %q: %d grants of %d permits in a row were past their local deadline on arrival (TTL %v)",
			ErrStaleGrant, printable(s.name), p.stale, p.k, s.cfg.ttl)
	}
	return false, nil
}

// Error maps acquire_n.lua's error replies; REDSEM_TOOMANY (k is more than
// the size stored in Redis) is ErrInvalidSize.
func (p *kTokens) Error(err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(string(re), "REDSEM_TOOMANY ") {
		stored := strings.TrimPrefix(string(re), "REDSEM_TOOMANY ")
		return fmt.Errorf("%w: %d permits of semaphore %q, whose size in Redis is %s", ErrInvalidSize, p.k, printable(p.s.name), stored)
	}
	return p.s.scriptError("acquire", err)
}

func (p *kTokens) Wrap(err error) error { return p.s.ctxError(err) }

// abortN runs abort_n.lua for acq in the given mode ("release" or
// "resolve"): it gives back everything acq holds or collects, leaves the
// ticket queue and hands the ticket on ("release"), or keeps a grant and
// reports it ("resolve").
func (s *Semaphore) abortN(actx context.Context, acq string, k int, mode string) (acquireNReply, error) {
	sent := monoNow()
	args := engine.Args(abortNScript, append(s.k.all(5), s.k.pend(acq), s.k.bell(acq), s.k.wqueue()),
		engine.A("acqID", acq), engine.A("k", k), engine.A("mode", mode), engine.A("tombMs", s.tombMs()))
	v, _, err := s.call(actx, abortNScript, args...)
	r, err := parseAcquireNReply(v, err)
	if err == nil {
		s.clock.observe(sent, r.nowUs)
	}
	return r, err
}
