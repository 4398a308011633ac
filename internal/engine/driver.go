package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/failpoint"
)

// The acquisition driver. Every blocking acquisition (a semaphore's Acquire
// and AcquireN, a rate gate's Wait) and every try (TryAcquire, TryAcquireN,
// Allow) runs the same loop, written once here:
//
//  1. Choose the pool (the blocking pool for a wait), take a connection.
//  2. Run the protocol's first script under a new acquisition id. It grants,
//     or registers the acquisition as waiting and says how to wait.
//  3. Write the blocking command the reply asks for (BLMOVE, BLPOP) and the
//     protocol's script behind it in one write, so that the script runs on
//     the server the moment the wait ends; repeat until a grant.
//  4. A reply that was not read (a broken connection, a lost reply) is
//     settled by the acquisition's id: with the context live, a grant found
//     that way is kept, and without one the wait starts over on a fresh
//     connection (at most MaxBrokenWaits times in a row). With the context
//     ended, whatever the acquisition holds goes back, in the background
//     within SettleTimeout, and the caller returns after SettleWait at most.
//  5. A reply that says the acquisition was settled behind its back
//     (aborted, dropped as dead, given back) starts a new one.
//
// Each protocol supplies a small adapter (Protocol): its scripts, its reply
// type, what its replies mean, and what a grant turns into.

// Reply codes shared by every acquisition script and their abort scripts
// (lua/common.lua names the same values).
const (
	CodeWaiting  = 0 // nothing granted yet: registered as waiting (or, for a try, refused)
	CodeGranted  = 1 // granted
	CodeSettled  = 2 // settled under this id (aborted, dropped as dead, ticket lost): nothing held
	CodeReleased = 3 // an abort gave a grant back
)

// Mode says how far one acquisition goes.
type Mode int

const (
	// ModeTry runs the first script only; a refusal returns its reply.
	ModeTry Mode = iota
	// ModeRegister is ModeTry that, when refused, stays registered as
	// waiting in Redis and returns that registration (a Pending) for a
	// later Drive in ModeWait to go on with.
	ModeRegister
	// ModeWait waits until a grant or the context's end.
	ModeWait
)

// Clock is where the driver reads the time, waits briefly for a settle and
// starts the goroutine that settles in the background. The semaphore's
// protocol explorer installs a virtual one.
type Clock interface {
	Now() time.Time
	WaitOrDone(ctx context.Context, done <-chan struct{}, d time.Duration)
	Go(f func())
}

// RealClock is the standard library's Clock.
type RealClock struct{}

// Now is time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// WaitOrDone returns once done is closed, ctx ends, or d has passed.
func (RealClock) WaitOrDone(ctx context.Context, done <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// Go runs f in a new goroutine.
func (RealClock) Go(f func()) { go f() }

// Protocol is what one kind of acquisition supplies to Drive. R is its
// decoded script reply.
type Protocol[R any] interface {
	// First runs the acquisition's first script for acq on conn. block is
	// how long it may wait afterwards (0: a try, never registered).
	First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (R, error)
	// Wait writes the blocking command r asks for and the protocol's script
	// behind it in one write (BlockThenRun), and returns the script's reply.
	// next is how long the wait after it may block.
	Wait(ctx context.Context, conn redis.Conn, acq string, r R, next time.Duration) (R, error)
	// Abort settles acq by its id in mode "resolve" (keep a grant, report it)
	// or "release" (give everything back). It must be idempotent.
	Abort(ctx context.Context, acq, mode string) (R, error)
	// Code is r's reply code (CodeWaiting...CodeReleased).
	Code(r R) int64
	// Block is how long the wait r asks for blocks.
	Block(r R) time.Duration
	// Moves reports whether the wait r asks for moves a token into the
	// waiter's pending list (BLMOVE): such a wait must not be sent after
	// Redis may have dropped the registration (see driveOn).
	Moves(r R) bool
	// Observe sees every reply and when (Clock.Now) its request was sent.
	Observe(r R, sent time.Time)
	// Accept is called with a grant. It returns true to end the drive, or
	// false when the grant cannot be used (it arrived past its lease's
	// local deadline) and was given back: then the drive starts a new
	// acquisition, unless Accept returns an error.
	Accept(ctx context.Context, acq string, r R, sent time.Time) (bool, error)
	// Error maps an error reply of the protocol's scripts (a redis.Error)
	// to the package's errors.
	Error(err error) error
	// Wrap wraps any other error the caller returns (the context's, a
	// connection's) with what was being acquired.
	Wrap(err error) error
}

// Pending is an acquisition registered as waiting by ModeRegister, for a
// later Drive to go on with (straight to its blocking wait).
type Pending[R any] struct {
	Acq   string
	Reply R
	Sent  time.Time
}

// Driver holds what the drives of one semaphore or gate share.
type Driver struct {
	// Pool serves tries and settling; Block serves blocking waits.
	Pool, Block Pool
	// MaxBlock caps one blocking wait (ns). It starts at engine.MaxBlock
	// and halves when a connection's read timeout proves shorter.
	MaxBlock *atomic.Int64
	// Grace is how long past its block Redis keeps a waiter registered
	// before it drops it as dead.
	Grace time.Duration
	// Clock is the time source; nil means RealClock.
	Clock Clock
}

// Result is how a drive ended without an error: granted (and accepted), or,
// for a try, refused with the reply that says so. Pending is set when
// ModeRegister left the acquisition registered.
type Result[R any] struct {
	Granted bool
	Reply   R
	Pending *Pending[R]
}

func (d *Driver) clock() Clock {
	if d.Clock == nil {
		return RealClock{}
	}
	return d.Clock
}

// Drive runs one acquisition of protocol p in mode, going on with start
// (a registration made by ModeRegister) if it is not nil.
func Drive[R any](ctx context.Context, d *Driver, p Protocol[R], mode Mode, start *Pending[R]) (Result[R], error) {
	if err := ctx.Err(); err != nil {
		if start != nil {
			Settle(ctx, d, p, start.Acq)
		}
		return Result[R]{}, p.Wrap(err)
	}
	pool := d.Pool
	if mode == ModeWait {
		pool = d.Block
	}
	broken := 0
	for {
		conn, err := pool.GetContext(ctx)
		if err != nil {
			if start != nil {
				Settle(ctx, d, p, start.Acq)
			}
			if err := CtxErr(ctx); err != nil {
				return Result[R]{}, p.Wrap(err)
			}
			return Result[R]{}, p.Wrap(err)
		}
		res, err := driveOn(ctx, d, p, conn, mode, start)
		start = nil
		conn.Close()
		var be *brokenWait
		if !errors.As(err, &be) {
			return res, err
		}
		if broken++; broken >= MaxBrokenWaits {
			return Result[R]{}, p.Wrap(be.err)
		}
	}
}

// brokenWait reports that the blocked connection broke while the context
// was still live and the acquisition was settled without a grant: start
// over on a fresh connection.
type brokenWait struct{ err error }

func (e *brokenWait) Error() string { return e.err.Error() }

// mappedErr carries an error reply of the blocking command, already mapped
// by the protocol.
type mappedErr struct{ err error }

func (e *mappedErr) Error() string { return e.err.Error() }

// BlockFor is how long the next blocking wait may last: at most MaxBlock,
// at most what is left of ctx, at least MinBlock.
func (d *Driver) BlockFor(ctx context.Context) time.Duration {
	b := time.Duration(d.MaxBlock.Load())
	if dl, ok := ctx.Deadline(); ok {
		if rem := time.Until(dl); rem < b {
			b = rem
		}
	}
	return max(b, MinBlock)
}

// driveOn runs one acquisition on conn: the first script (unless start says
// it ran), then, in ModeWait, blocking waits until a grant, the context's
// end, or a broken connection (a *brokenWait).
func driveOn[R any](ctx context.Context, d *Driver, p Protocol[R], conn redis.Conn, mode Mode, start *Pending[R]) (Result[R], error) {
	clk := d.clock()
	var (
		acq  string
		r    R
		err  error
		sent time.Time
	)
	waited := start != nil // whether acq has been registered as waiting
	first := func() {
		var block time.Duration
		switch mode {
		case ModeWait:
			block = d.BlockFor(ctx)
		case ModeRegister:
			block = time.Duration(d.MaxBlock.Load())
		}
		acq, sent, waited = NewAcqID(), clk.Now(), false
		failpoint.Hit("acquire.sent")
		r, err = p.First(ctx, conn, acq, block)
	}
	if start != nil {
		acq, r, sent = start.Acq, start.Reply, start.Sent
	} else {
		first()
	}
	var blockLeft time.Duration
	for {
		if err != nil {
			if r, err = failed(ctx, d, p, acq, err, blockLeft, waited); err != nil {
				return Result[R]{}, err
			}
		}
		p.Observe(r, sent)
		code := p.Code(r)
		switch code {
		case CodeGranted:
			failpoint.Hit("acquire.granted")
			ok, err := p.Accept(ctx, acq, r, sent)
			if err != nil {
				return Result[R]{}, err
			}
			if ok {
				return Result[R]{Granted: true, Reply: r}, nil
			}
		case CodeWaiting:
			switch mode {
			case ModeTry:
				return Result[R]{Reply: r}, nil
			case ModeRegister:
				return Result[R]{Reply: r, Pending: &Pending[R]{Acq: acq, Reply: r, Sent: sent}}, nil
			}
		}
		if err := CtxErr(ctx); err != nil {
			if code == CodeWaiting {
				// Registered as waiting: take the registration back rather
				// than leave it to Redis's sweep of dead waiters.
				Settle(ctx, d, p, acq)
			}
			return Result[R]{}, p.Wrap(err)
		}
		if code == CodeWaiting && p.Moves(r) && clk.Now().Sub(sent) >= p.Block(r)+d.Grace {
			// This process came back too late to wait on the registration
			// the reply made: Redis may have dropped it as dead, and a
			// BLMOVE now would move a token into a pending list only the
			// drop's tombstone still covers. Register afresh (the tombstone
			// turns the old id's script into "settled"). A wait on a
			// doorbell risks nothing: its script finds it dropped.
			code = CodeSettled
		}
		if code != CodeWaiting {
			// Settled behind our back, or a grant given back: start over as
			// a new acquisition.
			blockLeft = 0
			first()
			continue
		}
		used, began := p.Block(r), clk.Now()
		sent, waited = began, true
		r, err = p.Wait(ctx, conn, acq, r, d.BlockFor(ctx))
		blockLeft = used - clk.Now().Sub(began)
	}
}

// failed settles an acquisition whose reply was not read: the script may
// have run and granted, or a blocking command may still be registered. With
// the context ended everything goes back and the context's error is
// returned. Otherwise a grant is kept (returned), and without one a
// *brokenWait tells Drive to start over on a fresh connection.
//
// After an error reply nothing read is in doubt. A first script refuses
// before it writes anything, so there is nothing to settle (and bad input
// writes nothing); but behind a wait a token may sit in the waiter's pending
// list, or a weighted collector hold tokens: then it settles too.
func failed[R any](ctx context.Context, d *Driver, p Protocol[R], acq string, err error, blockLeft time.Duration, waited bool) (R, error) {
	var zero R
	if errors.Is(err, ErrArity) {
		// Nothing was sent: a bug to report, not a wait to settle.
		return zero, p.Wrap(err)
	}
	if IsRedisError(err) {
		if waited {
			Settle(ctx, d, p, acq)
		}
		return zero, p.Error(err)
	}
	var me *mappedErr
	if errors.As(err, &me) {
		Settle(ctx, d, p, acq)
		return zero, me.err
	}
	if CtxErr(ctx) == nil {
		rctx, cancel := context.WithTimeout(ctx, SettleTimeout)
		r, aerr := p.Abort(rctx, acq, "resolve")
		cancel()
		switch {
		case aerr == nil && p.Code(r) == CodeGranted:
			return r, nil
		case aerr == nil:
			d.fitBlock(err, blockLeft)
			return zero, &brokenWait{err}
		case CtxErr(ctx) == nil:
			return zero, p.Wrap(fmt.Errorf("%w (settling it failed too: %v)", err, aerr))
		}
	}
	Settle(ctx, d, p, acq)
	return zero, p.Wrap(CtxErr(ctx))
}

// Settle gives back whatever acquisition acq may hold or be registered for.
// It waits for that briefly (SettleWait), so that normally everything is
// settled when the caller returns, but never holds the caller long against a
// server that does not answer: the settle goes on in the background for at
// most SettleTimeout.
func Settle[R any](ctx context.Context, d *Driver, p Protocol[R], acq string) {
	clk := d.clock()
	done := make(chan struct{})
	clk.Go(func() {
		defer close(done)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SettleTimeout)
		defer cancel()
		_, _ = p.Abort(actx, acq, "release")
	})
	clk.WaitOrDone(context.Background(), done, SettleWait)
}

// fitBlock halves the longest block when a wait broke on the connection's
// read deadline well before the wait's own timeout (blockLeft was left of
// it): that connection's read timeout is shorter than the block.
func (d *Driver) fitBlock(err error, blockLeft time.Duration) {
	var ne net.Error
	if blockLeft > time.Second && errors.As(err, &ne) && ne.Timeout() {
		if cur := time.Duration(d.MaxBlock.Load()); cur > time.Second {
			d.MaxBlock.Store(int64(cur / 2))
		}
	}
}

// ErrSkipped is what a wait whose script a failpoint skipped reports.
var ErrSkipped = errors.New("redsem: failpoint skipped the script behind the wait")

// Blocking is a blocking command a waiter sleeps in: BLMOVE (a token from
// one list into the waiter's own) or BLPOP (the waiter's doorbell).
type Blocking struct {
	move     bool
	src, dst string
}

// BLMOVE moves the first element of src to the end of dst when there is one.
func BLMOVE(src, dst string) Blocking { return Blocking{move: true, src: src, dst: dst} }

// BLPOP pops the first element of key when there is one.
func BLPOP(key string) Blocking { return Blocking{src: key} }

// BlockThenRun writes a blocking command that waits block at most, and
// script with scriptArgs behind it, in one write, and returns the script's
// reply: when the blocking command returns, Redis runs the script right
// behind it, before the client reads a byte. An error reply of the blocking
// command is returned mapped by mapErr. A script unknown to the server
// (NOSCRIPT) is run again with its source.
func BlockThenRun(ctx context.Context, conn redis.Conn, block time.Duration, wait Blocking,
	script *redis.Script, scriptArgs []interface{}, mapErr func(error) error) (interface{}, error) {
	if err := checkArity(script, scriptArgs); err != nil {
		return nil, err
	}
	// Round up: never a wait of 0, which would block forever.
	ms := (block + time.Millisecond - 1).Milliseconds()
	secs := strconv.FormatFloat(float64(ms)/1000, 'f', 3, 64)
	var err error
	if wait.move {
		err = conn.Send("BLMOVE", wait.src, wait.dst, "LEFT", "RIGHT", secs)
	} else {
		err = conn.Send("BLPOP", wait.src, secs)
	}
	if err != nil {
		return nil, err
	}
	skip := failpoint.Hit("wait.script")
	if !skip {
		if err := script.SendHash(conn, scriptArgs...); err != nil {
			return nil, err
		}
	}
	if err := conn.Flush(); err != nil {
		return nil, err
	}
	failpoint.Hit("wait.sent")
	rctx, cancel := context.WithTimeout(ctx, block+BlockSlack)
	defer cancel()
	_, waitErr := redis.ReceiveContext(conn, rctx)
	if waitErr != nil && !IsRedisError(waitErr) {
		return nil, waitErr
	}
	if skip {
		return nil, ErrSkipped
	}
	v, err := redis.ReceiveContext(conn, rctx)
	if re, ok := err.(redis.Error); ok && strings.HasPrefix(string(re), "NOSCRIPT") {
		v, err = script.DoContext(ctx, conn, scriptArgs...)
	}
	if waitErr != nil {
		return nil, &mappedErr{mapErr(waitErr)}
	}
	return v, err
}
