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

// Weighted acquisition (acquire_n.lua): AcquireN and TryAcquireN take k
// tokens at once. Weighted requests queue first come, first served for one
// collector ticket (meta field "coll"); each sleeps in BLPOP on a doorbell of
// its own. The collector waits for its first token in the ordinary token
// queue (BLMOVE); once it holds one, release.lua hands it every released
// token until it has k and rings its doorbell. What it holds meanwhile are
// leases with fence 0, sealed into one lease when it has k, at most 128 a
// run. docs/waiting.md has the fairness rules and the costs.

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
// lease on all k, or until ctx ends; it is all or nothing and, when it
// fails, holds none. Large requests are not starved by smaller ones
// (docs/waiting.md). k must be between 1 and the size (ErrInvalidSize).
// Errors otherwise are Acquire's.
func (s *Semaphore) AcquireN(ctx context.Context, k int) (*Lease, error) {
	if k == 1 {
		return s.Acquire(ctx)
	}
	w := s.watch(ctx, s.role())
	if err := s.checkN(k); err != nil {
		return s.observeAcquire(w, nil, err)
	}
	l, err := s.acquireN(ctx, k, true)
	return s.observeAcquire(w, l, err)
}

// TryAcquireN returns a lease on k tokens if k are free now and no
// weighted request is collecting or waiting, and ErrNoToken otherwise. It
// never waits and holds nothing after a failure; up to 128 tokens it is one
// round trip.
func (s *Semaphore) TryAcquireN(ctx context.Context, k int) (*Lease, error) {
	if k == 1 {
		return s.TryAcquire(ctx)
	}
	w := s.watch(ctx, s.role())
	if err := s.checkN(k); err != nil {
		return s.observeAcquire(w, nil, err)
	}
	l, err := s.acquireN(ctx, k, false)
	return s.observeAcquire(w, l, err)
}

func (s *Semaphore) checkN(k int) error {
	if s.cfg.adoptSize && k >= 1 && k <= MaxSize {
		return nil // checked against the stored size by the script
	}
	if k < 1 || k > s.size {
		return fmt.Errorf("%w: %d permits of semaphore %q of size %d", ErrInvalidSize, k, engine.Printable(s.name), s.size)
	}
	return nil
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

// parseAcquireNReply decodes a reply of acquire_n.lua or abort_n.lua:
// {1, fence, deadlineMs, nowUs, tokens...} granted, {0, blockMs, nowUs,
// mode, have} waiting, {code, x, nowUs} otherwise.
func parseAcquireNReply(v interface{}, err error) (engine.Reply, error) {
	vals, err := redis.Values(v, err)
	if err != nil {
		return engine.Reply{}, err
	}
	var r engine.Reply
	if len(vals) == 0 {
		return r, fmt.Errorf("unexpected reply %v", vals)
	}
	if r.Code, err = redis.Int64(vals[0], nil); err != nil {
		return r, err
	}
	switch {
	case r.Code == engine.CodeGranted && len(vals) == 5: // the tokens in one string
		var listed string
		_, err = redis.Scan(vals[1:], &r.Fence, &r.DeadlineMs, &r.NowUs, &listed)
		r.Tokens = strings.Fields(listed)
	case r.Code == engine.CodeWaiting && len(vals) == 5:
		var blockMs, have int64
		_, err = redis.Scan(vals[1:], &blockMs, &r.NowUs, &r.Mode, &have)
		r.Block, r.Moves = time.Duration(blockMs)*time.Millisecond, r.Mode == modeMove
	case len(vals) == 3 && r.Code != engine.CodeGranted: // settled, or abort_n.lua's replies
		_, err = redis.Scan(vals[2:], &r.NowUs)
	default:
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	return r, err
}

// acquireNCall is acquire_n.lua's call.
func (s *Semaphore) acquireNCall(acq string, k int, blockMs int64, phase string) engine.Run {
	return engine.AcquireN.With(append(s.k.all(5), s.k.pend(acq), s.k.bell(acq), s.k.wqueue()), engine.AcquireNArgs{
		Size: s.size, AcqID: acq, K: k, TTLMs: s.cfg.ttl.Milliseconds(), Label: s.cfg.label, BlockMs: blockMs,
		GraceMs: min(s.cfg.grace, collectGrace).Milliseconds(), TombMs: s.tombMs(), PollMs: collectPoll.Milliseconds(),
		Phase: phase, SizeMode: s.sizeMode(), IdleMs: s.cfg.idle.Milliseconds()})
}

func (s *Semaphore) acquireN(ctx context.Context, k int, wait bool) (*Lease, error) {
	mode := engine.ModeTry
	if wait {
		mode = engine.ModeWait
	}
	p := &kTokens{s: s, k: k}
	// A weighted registration lapses collectGrace (or the grace, if
	// shorter) after a missed check-in, not the grace.
	d := s.driver(p.fail)
	d.Grace = min(s.cfg.grace, collectGrace)
	res, err := engine.Drive(ctx, d, p, mode, nil)
	switch {
	case err != nil:
		return nil, err
	case res.Granted:
		return p.lease, nil
	}
	return nil, fmt.Errorf("%w: semaphore %q: %d permits", ErrNoToken, engine.Printable(s.name), k)
}

// kTokens is the protocol of k tokens at once: acquire_n.lua, behind
// BLMOVE (a collector before its first token) or BLPOP on the waiter's
// doorbell (queued for the ticket, or collecting), and abort_n.lua.
type kTokens struct {
	s     *Semaphore
	k     int
	lease *Lease
}

// First runs acquire_n.lua's first run. A TryAcquireN of more than
// tryStep tokens runs it again ("more") on the same connection until it
// grants or refuses; one whose later run failed with an error reply gives
// back what it collected before it returns the error (the driver settles
// only waits, and a failed first run holds nothing).
func (p *kTokens) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (engine.Reply, error) {
	r, err := parseAcquireNReply(engine.RunScript(ctx, conn, p.s.acquireNCall(acq, p.k, block.Milliseconds(), "fresh")))
	for err == nil && block == 0 && r.Code == engine.CodeWaiting && r.Mode == modeMore {
		r, err = parseAcquireNReply(engine.RunScript(ctx, conn, p.s.acquireNCall(acq, p.k, 0, "more")))
		switch {
		case err != nil && engine.IsRedisError(err):
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engine.SettleTimeout)
			_, _ = p.Abort(actx, acq, "release")
			cancel()
		case err == nil && r.Code == engine.CodeSettled:
			// It lost the ticket between two runs: refused, nothing held.
			r.Code = engine.CodeWaiting
		}
	}
	return r, err
}

// Wait writes the wait r asks for (BLMOVE into the pending list, or BLPOP
// on the doorbell) and acquire_n.lua in one write, so that the script runs
// on the server the moment the wait ends.
func (p *kTokens) Wait(ctx context.Context, conn redis.Conn, acq string, r engine.Reply, next time.Duration) (engine.Reply, error) {
	s := p.s
	wait := engine.BLPOP(s.k.bell(acq))
	if r.Mode == modeMove {
		wait = engine.BLMOVE(s.k.tokens, s.k.pend(acq))
	}
	return parseAcquireNReply(engine.BlockThenRun(ctx, conn, r.Block, wait,
		s.acquireNCall(acq, p.k, next.Milliseconds(), "wait")))
}

// Abort runs abort_n.lua for acq in mode "release" (give back everything
// acq holds or collects, leave the ticket queue, hand the ticket on) or
// "resolve" (keep a grant and report it).
func (p *kTokens) Abort(ctx context.Context, acq, mode string) (engine.Reply, error) {
	s := p.s
	v, _, err := engine.Call(ctx, s.pool, engine.AbortN.With(append(s.k.all(5), s.k.pend(acq), s.k.bell(acq), s.k.wqueue()),
		engine.AbortNArgs{AcqID: acq, K: p.k, Mode: mode, TombMs: s.tombMs()}))
	return parseAcquireNReply(v, err)
}

// Accept takes a grant, unless it is older than its lease allows (this
// process was frozen, or the TTL is shorter than a round trip): such a
// grant is given back.
func (p *kTokens) Accept(ctx context.Context, acq string, r engine.Reply, sent time.Time) bool {
	p.lease = p.s.takeGrant(ctx, acq, r, sent)
	return p.lease != nil
}

// fail maps acquire_n.lua's error replies; REDSEM_TOOMANY (k is more than
// the size stored in Redis) is ErrInvalidSize.
func (p *kTokens) fail(err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(string(re), "REDSEM_TOOMANY ") {
		stored := strings.TrimPrefix(string(re), "REDSEM_TOOMANY ")
		return fmt.Errorf("%w: %d permits of semaphore %q, whose size in Redis is %s", ErrInvalidSize, p.k, engine.Printable(p.s.name), stored)
	}
	if engine.IsRedisError(err) {
		return p.s.scriptError("acquire", err)
	}
	return p.s.ctxError(err)
}
