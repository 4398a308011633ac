package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
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
//     connection (at most MaxBrokenWaits times in a row). While Redis is
//     unreachable (restarting, say), settling and the fresh connection's
//     dial are tried again with backoff as long as the context lasts.
//     With the context ended, whatever the acquisition holds goes back, in
//     the background within SettleTimeout, and the caller returns after
//     SettleWait at most.
//  5. A reply that says the acquisition was settled behind its back
//     (aborted, dropped as dead, given back) starts a new one.
//
// Each protocol (Protocol) supplies its scripts and what a grant turns into;
// every reply is decoded into one Reply.

// Reply codes shared by every acquisition script and their abort scripts
// (lua/codes.lua names the same values).
const (
	CodeWaiting  = 0 // nothing granted yet: registered as waiting (or, for a try, refused)
	CodeGranted  = 1 // granted
	CodeSettled  = 2 // settled under this id (aborted, dropped as dead, ticket lost): nothing held
	CodeReleased = 3 // an abort gave a grant back
)

// The driver's bounds.
const (
	// MaxBlock caps one blocking wait; a wait that long starts over. The
	// connection's read timeout should be 0 or above MaxBlock+BlockSlack.
	MaxBlock = 30 * time.Second
	// BlockSlack is how long past a blocking command's own timeout the
	// client waits for its reply.
	BlockSlack = 2 * time.Second
	// MinBlock is the shortest blocking wait.
	MinBlock = 10 * time.Millisecond
	// MaxBrokenWaits bounds how many times in a row a wait starts over after
	// its blocked connection broke before it gives up and returns the error.
	MaxBrokenWaits = 5
	// MaxStaleGrants bounds how many grants in a row an acquisition gives
	// back because they reached it after their lease's local deadline.
	MaxStaleGrants = 3
	// SettleTimeout bounds settling an acquisition or a rate gate's wait by
	// its id after its reply was lost or its context ended.
	SettleTimeout = 5 * time.Second
	// SettleWait is how long a cancelled wait of any kind (Acquire,
	// AcquireN, a rate gate's Wait) waits for that settling before it
	// returns; the settling goes on in the background, within SettleTimeout.
	SettleWait = 250 * time.Millisecond
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

// Clock is where the driver and a semaphore's leases read the time, arm a
// timer, wait and start goroutines: driveOn's times, Settle and its wait,
// shared waiting's pumps, its waiters and its last waiter's wait, a grant
// given back, a lease's deadline timer, auto-refresh's timer and the
// goroutine of each refresh, Release's wait for auto-refresh to stop, and a rate gate's queue
// head and Start.Waited. Not through it: the timeouts of contexts (a
// settle's, a release's, a refresh's, a blocking read's) and the deadline
// CtxErr and BlockFor read, and the times and the goroutine of an
// Observer's reports (a semaphore's or a rate gate's). The protocol
// explorer's tests install a virtual Clock.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
	// WaitOrDone returns once done is closed, ctx ends, or d has passed;
	// with d Forever, only once done is closed or ctx ends.
	WaitOrDone(ctx context.Context, done <-chan struct{}, d time.Duration)
	Go(f func())
}

// Forever, as WaitOrDone's d, sets no time limit.
const Forever = time.Duration(math.MaxInt64)

// Timer is the part of *time.Timer a lease uses.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// RealClock is the standard library's Clock.
type RealClock struct{}

// Now is time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// WaitOrDone returns once done is closed, ctx ends, or d (unless Forever)
// has passed.
func (RealClock) WaitOrDone(ctx context.Context, done <-chan struct{}, d time.Duration) {
	var timeout <-chan time.Time
	if d != Forever {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-timeout:
	}
}

// Go runs f in a new goroutine.
func (RealClock) Go(f func()) { go f() }

// Clk is the Clock of every acquisition, lease and rate gate; the protocol
// explorer's tests swap in a virtual one.
var Clk Clock = RealClock{}

// Reply is an acquisition script's reply, decoded. Every protocol's replies
// fit it; a field a protocol's scripts do not send stays zero.
type Reply struct {
	Code  int64         // CodeWaiting ... CodeReleased
	Block time.Duration // CodeWaiting: how long the next wait blocks (a try: when to try again)
	// Moves, with CodeWaiting: the wait moves a token into the waiter's pending list
	// (BLMOVE), so it must not be sent once Redis may have dropped the
	// registration (see driveOn). A doorbell (BLPOP) moves nothing.
	Moves bool
	NowUs int64 // Redis TIME, µs, when the script ran

	// A grant's.
	Tokens     []string
	Fence      int64
	DeadlineMs int64

	Mode    int64 // a weighted wait's kind (acquire_n.lua)
	Head    bool  // a rate waiter at the head of its queue
	GrantUs int64 // a rate start's time
}

// Protocol is what differs between the kinds of acquisition: its scripts,
// and what a grant turns into.
type Protocol interface {
	// First runs the acquisition's first script for acq on conn. block is
	// how long it may wait afterwards (0: a try, never registered).
	First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (Reply, error)
	// Wait writes the blocking command r asks for and the protocol's script
	// behind it in one write (BlockThenRun), and returns the script's reply.
	// next is how long the wait after it may block.
	Wait(ctx context.Context, conn redis.Conn, acq string, r Reply, next time.Duration) (Reply, error)
	// Abort settles acq by its id in mode "resolve" (keep a grant, report it)
	// or "release" (give everything back). It must be idempotent.
	Abort(ctx context.Context, acq, mode string) (Reply, error)
	// Accept takes a grant and returns true, or gives it back and returns
	// false when it cannot be used (it arrived past its lease's local
	// deadline): then the drive starts a new acquisition, MaxStaleGrants
	// times in a row at most.
	Accept(ctx context.Context, acq string, r Reply, sent time.Time) bool
}

// Queuer is a Protocol whose first script can travel with its wait.
type Queuer interface {
	// Queue writes acq's registration, its blocking command and the script
	// behind it in one write (QueueThenRun) and returns that script's
	// reply; or it sends nothing and reports false, and the acquisition
	// starts with First.
	Queue(ctx context.Context, conn redis.Conn, acq string) (Reply, bool, error)
}

// Pending is an acquisition registered as waiting by ModeRegister, for a
// later Drive to go on with (straight to its blocking wait).
type Pending struct {
	Acq   string
	Reply Reply
	Sent  time.Time
}

// Driver holds what the drives of one semaphore, lock or gate share.
type Driver struct {
	// Pool serves tries and settling; Block serves blocking waits.
	Pool, Block Pool
	// MaxBlock caps one blocking wait (ns). It starts at engine.MaxBlock
	// and halves when a connection's read timeout proves shorter.
	MaxBlock *atomic.Int64
	// Grace is how long past its block Redis keeps a waiter registered
	// before it drops it as dead.
	Grace time.Duration
	// Observe, if set, sees the server time of every reply and when
	// (Clock.Now) its request was sent.
	Observe func(sent time.Time, nowUs int64)
	// Fail turns an error into the caller's: an error reply of the
	// protocol's scripts (a redis.Error) into the package's sentinels,
	// anything else (the context's, a connection's) wrapped with what was
	// being acquired.
	Fail func(err error) error
}

// Result is how a drive ended without an error: granted (and accepted), or,
// for a try, refused with the reply that says so. Pending is set when
// ModeRegister left the acquisition registered.
type Result struct {
	Granted bool
	Reply   Reply
	Pending *Pending
}

// Drive runs one acquisition of protocol p in mode, going on with start
// (a registration made by ModeRegister) if it is not nil.
func Drive(ctx context.Context, d *Driver, p Protocol, mode Mode, start *Pending) (Result, error) {
	if err := ctx.Err(); err != nil {
		if start != nil {
			Settle(ctx, d, p, start.Acq)
		}
		return Result{}, d.Fail(err)
	}
	pool := d.Pool
	if mode == ModeWait {
		pool = d.Block
	}
	broken, down := 0, 0
	// waitOn reports whether a wait whose connection broke waits on after
	// err: a dial that failed (Redis restarting, say) while ctx lasts.
	waitOn := func(err error) bool {
		if broken == 0 || !NotSent(err) || CtxErr(ctx) != nil {
			return false
		}
		backoff(ctx, down)
		down++
		return true
	}
	for {
		conn, err := pool.GetContext(ctx)
		if err != nil {
			if waitOn(err) {
				continue
			}
			if start != nil {
				Settle(ctx, d, p, start.Acq)
			}
			if cerr := CtxErr(ctx); cerr != nil {
				err = cerr
			}
			return Result{}, d.Fail(err)
		}
		res, err := driveOn(ctx, d, p, conn, mode, start)
		start = nil
		conn.Close()
		var be *brokenWait
		if errors.As(err, &be) {
			if broken++; broken >= MaxBrokenWaits {
				return Result{}, d.Fail(be.err)
			}
			down = 0
			continue
		}
		if err == nil || !waitOn(err) {
			return res, err
		}
	}
}

// brokenWait reports that the blocked connection broke while the context
// was still live and the acquisition was settled without a grant: start
// over on a fresh connection.
type brokenWait struct{ err error }

func (e *brokenWait) Error() string { return e.err.Error() }

// waitReplyErr carries an error reply of the blocking command (a key of the
// wrong type, say): the wait may have left something to settle.
type waitReplyErr struct{ err error }

func (e *waitReplyErr) Error() string { return e.err.Error() }

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
func driveOn(ctx context.Context, d *Driver, p Protocol, conn redis.Conn, mode Mode, start *Pending) (Result, error) {
	clk := Clk
	var (
		acq  string
		r    Reply
		err  error
		sent time.Time
	)
	waited := start != nil // whether acq has been registered as waiting
	stale := 0             // grants in a row that were unusable on arrival
	first := func() {
		var block time.Duration
		switch mode {
		case ModeWait:
			block = d.BlockFor(ctx)
		case ModeRegister:
			block = time.Duration(d.MaxBlock.Load())
		}
		acq, sent, waited = NewAcqID(), clk.Now(), false
		failpoint.Hit("acquire.sent") // a fault test's hook; a no-op in production
		if q, ok := p.(Queuer); ok && mode == ModeWait {
			var queued bool
			if r, queued, err = q.Queue(ctx, conn, acq); queued {
				waited = true
				return
			}
		}
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
				return Result{}, err
			}
		}
		if d.Observe != nil {
			d.Observe(sent, r.NowUs)
		}
		code := r.Code
		switch code {
		case CodeGranted:
			failpoint.Hit("acquire.granted")
			if p.Accept(ctx, acq, r, sent) {
				return Result{Granted: true, Reply: r}, nil
			}
			if stale++; stale >= MaxStaleGrants {
				return Result{}, d.Fail(fmt.Errorf("%w: %d grants in a row were past their local deadline on arrival",
					ErrStaleGrant, stale))
			}
		case CodeWaiting:
			stale = 0
			switch mode {
			case ModeTry:
				return Result{Reply: r}, nil
			case ModeRegister:
				return Result{Reply: r, Pending: &Pending{Acq: acq, Reply: r, Sent: sent}}, nil
			}
		}
		if err := CtxErr(ctx); err != nil {
			if code == CodeWaiting {
				// Registered as waiting: take the registration back rather
				// than leave it to Redis's sweep of dead waiters.
				Settle(ctx, d, p, acq)
			}
			return Result{}, d.Fail(err)
		}
		if code == CodeWaiting && r.Moves && clk.Now().Sub(sent) >= r.Block+d.Grace {
			// This process came back too late to wait on the registration
			// the reply made: Redis may have dropped it as dead, and a
			// BLMOVE now would move a token into a pending list only the
			// drop's tombstone still covers. Register afresh (the tombstone
			// turns the old id's script into "settled").
			code = CodeSettled
		}
		if code != CodeWaiting {
			// Settled behind our back, or a grant given back: start over as
			// a new acquisition.
			blockLeft = 0
			first()
			continue
		}
		used, began := r.Block, clk.Now()
		sent, waited = began, true
		r, err = p.Wait(ctx, conn, acq, r, d.BlockFor(ctx))
		blockLeft = used - clk.Now().Sub(began)
	}
}

// NewAcqID returns a random 128-bit acquisition id, in hex. Every
// acquisition carries one, chosen before its first command: its lease or
// start is recorded under it, and an acquisition whose reply was lost is
// settled by it.
func NewAcqID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("redsem: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// failed settles an acquisition whose reply was not read (or was read as
// its context ended): the script may have run and granted, or a blocking
// command may still be registered. With the context ended everything goes
// back and the context's error is returned. Otherwise a grant is kept
// (returned), and without one a *brokenWait tells Drive to start over on a
// fresh connection; settling that fails because Redis is unreachable is
// tried again with backoff until Redis answers or the context ends.
//
// After an error reply nothing read is in doubt. A first script refuses
// before it writes anything, so there is nothing to settle (and bad input
// writes nothing); but behind a wait a token may sit in the waiter's pending
// list, or a weighted collector hold tokens: then it settles too.
func failed(ctx context.Context, d *Driver, p Protocol, acq string, err error, blockLeft time.Duration, waited bool) (Reply, error) {
	var zero Reply
	if IsRedisError(err) || NotSent(err) {
		// An error reply, or a dial that failed before anything was sent
		// (a pool that dials lazily): nothing of this attempt is in doubt.
		if waited {
			Settle(ctx, d, p, acq)
		}
		return zero, d.Fail(err)
	}
	if errors.Is(err, ErrNotQueued) {
		// The registration refused and its connection is gone: settle
		// whatever its wait may have moved, and start over.
		Settle(ctx, d, p, acq)
		return zero, &brokenWait{err}
	}
	var we *waitReplyErr
	if errors.As(err, &we) {
		Settle(ctx, d, p, acq)
		return zero, d.Fail(we.err)
	}
	for n := 0; CtxErr(ctx) == nil; n++ {
		// Resolve it, as long as the context lasts: Redis may be
		// restarting, or the network down; a waiter waits that out.
		rctx, cancel := context.WithTimeout(ctx, SettleTimeout)
		r, aerr := p.Abort(rctx, acq, "resolve")
		cancel()
		switch {
		case aerr == nil && r.Code == CodeGranted:
			return r, nil
		case aerr == nil:
			d.fitBlock(err, blockLeft)
			return zero, &brokenWait{err}
		case !unreachable(aerr) && CtxErr(ctx) == nil:
			// Redis answers, and refuses (or a write was not
			// replicated): that is the error.
			Settle(ctx, d, p, acq)
			return zero, d.Fail(aerr)
		}
		backoff(ctx, n)
	}
	Settle(ctx, d, p, acq)
	return zero, d.Fail(CtxErr(ctx))
}

// backoff waits before retry n (0-based) of a call that found Redis
// unreachable or not ready: 10ms doubling to 500ms, or until ctx ends.
func backoff(ctx context.Context, n int) {
	Clk.WaitOrDone(ctx, nil, min(10*time.Millisecond<<min(n, 6), 500*time.Millisecond))
}

// unreachable reports whether err says Redis could not be reached or did
// not answer (a failed dial, a closed or reset connection, a timeout), or
// answered with a transient reply: the same call may work soon.
func unreachable(err error) bool {
	var ne net.Error
	return NotSent(err) || DeadConn(err) || errors.As(err, &ne) ||
		errors.Is(err, context.DeadlineExceeded) || transient(err)
}

// transient reports whether err is an error reply Redis sends while it
// cannot serve yet (loading its data, a script running too long, a
// failover or resharding under way): the same call may work soon.
func transient(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	code, _, _ := strings.Cut(string(re), " ")
	switch code {
	case "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY":
		return true
	}
	return false
}

// Settle gives back whatever acquisition acq may hold or be registered for.
// It waits for that briefly (SettleWait), so that normally everything is
// settled when the caller returns, but never holds the caller long against a
// server that does not answer: the settle goes on in the background for at
// most SettleTimeout.
func Settle(ctx context.Context, d *Driver, p Protocol, acq string) {
	clk := Clk
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
// the script call next behind it, in one write, and returns the script's
// reply: when the blocking command returns, Redis runs the script right
// behind it, before the client reads a byte. An error reply of the blocking
// command is returned for Drive to settle and map. A script unknown to the server
// (NOSCRIPT) is run again with its source.
func BlockThenRun(ctx context.Context, conn redis.Conn, block time.Duration, wait Blocking, next Run) (interface{}, error) {
	return queueThenRun(ctx, conn, nil, nil, block, wait, next)
}

// QueueThenRun is BlockThenRun with a registration in front, in the same
// write: reg, sent with its source (EVAL) so that it never
// meets NOSCRIPT, then the blocking command, then script. registered
// reads reg's reply: whether the blocking command may move a token (reg
// recorded the waiter, so that a sweep finds what it moves). When it may
// not, the connection is dropped, which ends a blocked command, and
// ErrNotQueued returned: the acquisition is to be settled and started
// over.
func QueueThenRun(ctx context.Context, conn redis.Conn, reg Run, registered func(interface{}) bool,
	block time.Duration, wait Blocking, next Run) (interface{}, error) {
	return queueThenRun(ctx, conn, &reg, registered, block, wait, next)
}

// dropConn breaks conn, so that what it still waits for (a blocked
// command) ends with it: a read under a context past its deadline does so
// at once.
func dropConn(ctx context.Context, conn redis.Conn) {
	dead, cancel := context.WithDeadline(ctx, time.Unix(0, 0))
	defer cancel()
	_, _ = redis.ReceiveContext(conn, dead)
}

// ErrNotQueued is QueueThenRun's report that the registration refused.
var ErrNotQueued = errors.New("redsem: the waiter's registration was refused")

func queueThenRun(ctx context.Context, conn redis.Conn, reg *Run, registered func(interface{}) bool,
	block time.Duration, wait Blocking, next Run) (interface{}, error) {
	script, scriptArgs := next.Script, next.KeysAndArgs
	hash, err := script.hashOn(ctx, conn) // sends nothing but in a process's first wait
	if err != nil {
		return nil, err
	}
	if reg != nil {
		if err := conn.Send("EVAL", reg.Script.args(reg.Script.src, reg.KeysAndArgs)...); err != nil {
			return nil, err
		}
	}
	// Round up: never a wait of 0, which would block forever.
	ms := (block + time.Millisecond - 1).Milliseconds()
	secs := strconv.FormatFloat(float64(ms)/1000, 'f', 3, 64)
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
		if err := conn.Send("EVALSHA", script.args(hash, scriptArgs)...); err != nil {
			return nil, err
		}
	}
	if err := conn.Flush(); err != nil {
		return nil, err
	}
	failpoint.Hit("wait.sent")
	rctx, cancel := context.WithTimeout(ctx, block+BlockSlack)
	defer cancel()
	if reg != nil {
		// The registration's reply: at once on redigo; with the wait's on a
		// client that answers a write as a whole (goredis.Pool).
		v, err := redis.ReceiveContext(conn, rctx)
		if err != nil && !IsRedisError(err) {
			return nil, err
		}
		if err != nil || !registered(v) {
			dropConn(ctx, conn)
			return nil, ErrNotQueued
		}
	}
	if err := ctx.Err(); err != nil {
		// Ended before the read: fail it even if the reply is in, as a
		// read under an ended context may or may not on redigo. The
		// driver settles by id.
		dropConn(ctx, conn)
		return nil, err
	}
	_, waitErr := redis.ReceiveContext(conn, rctx)
	if waitErr != nil && !IsRedisError(waitErr) {
		return nil, waitErr
	}
	if skip {
		return nil, ErrSkipped
	}
	// The script's reply follows at once (Redis ran it right behind the
	// blocking command): read it without ReceiveContext's watcher goroutine.
	v, err := redis.ReceiveWithTimeout(conn, BlockSlack)
	if noScript(err) {
		v, err = redis.DoContext(conn, ctx, "EVAL", script.args(script.src, scriptArgs)...)
	}
	if cerr := ctx.Err(); cerr != nil {
		// Ended while the replies were read: a read under an ended
		// context may have got them or not, so fail it either way, as
		// above; the driver gives back by id whatever it was granted.
		return nil, cerr
	}
	if waitErr != nil {
		return nil, &waitReplyErr{waitErr}
	}
	return v, err
}
