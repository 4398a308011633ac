package redsem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// An election, from the call to Redis and back (docs/election.md):
//
//	Campaign ─ Acquire of the election's mutex (tokens.go: FIFO, waits in Redis)
//	         └ election.lua "claim": announce the holder, log the change, ring observers
//	Proclaim ─ election.lua "claim" with the new value
//	Resign   ─ election.lua "resign", then Lease.Release
//	Observe  ─ election_observe.lua, then BLPOP on the observer's doorbell with
//	           election_observe.lua behind it, in one write, again and again
//	Leader   ─ election_observe.lua once

// Election is a leader election on a name, shared through Redis: at most one
// campaigner leads at a time, across every process using the same name and
// prefix, and each leadership has a term above every earlier one. It is
// built on a Mutex of its own keys (<prefix>{<name>}:el:), so campaigners
// are served first come, first served, a leader's lease refreshes itself
// while its process lives, and a leader that dies loses within one TTL. An
// Election is safe for concurrent use.
type Election struct {
	s *Semaphore // the election's mutex
}

// Leader is an election's leader as Leader and Observe report it.
type Leader struct {
	Term  int64  // the leadership's term (Leadership.Term); 0: no leader
	Value string // what the leader campaigned or last proclaimed with
}

// Leadership is a won Campaign, held until Resign or until it is lost.
type Leadership struct {
	e     *Election
	lease *Lease
	mu    sync.Mutex // serialises Proclaim
}

// maxElectionValue is the longest value a leader may announce, in bytes.
const maxElectionValue = 4096

// NewElection returns the election called name. It checks its arguments
// and does no I/O. It refuses WithFixedTTL, WithAdoptSize and
// WithIdleExpiry (ErrInvalidOption): a leadership refreshes itself, and the
// election's keys do not expire.
func NewElection(pool Pool, name string, opts ...Option) (*Election, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := engine.CheckName(name); err != nil {
		return nil, err
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.fixedTTL || cfg.adoptSize || cfg.idle != 0 {
		return nil, fmt.Errorf("%w: WithFixedTTL, WithAdoptSize and WithIdleExpiry do not apply to an election", ErrInvalidOption)
	}
	s := &Semaphore{pool: pool, block: pool, name: name, size: 1, cfg: cfg,
		k: keysAt(engine.KeyBase(cfg.prefix, name) + "el:"), kind: electionLeases, observedAs: "election"}
	if cfg.blockPool != nil {
		s.block = cfg.blockPool
	}
	s.maxBlock.Store(int64(engine.MaxBlock))
	return &Election{s: s}, nil
}

// electionLeases are a semaphore's leases, named as an election's in errors.
var electionLeases = &leaseKind{what: "election", release: &engine.Release, refresh: &engine.Refresh,
	keys: func(k keys) []interface{} { return k.all(4) }}

// Name returns the election's name as given to NewElection.
func (e *Election) Name() string { return e.s.name }

// Campaign blocks until this caller leads, or until ctx ends: then
// errors.Is(err, ctx.Err()) holds and nothing of the campaign is left in
// Redis. Campaigners are served first come, first served. The leader
// announces value (at most 4096 bytes), which Leader and Observe report.
// Other errors are Acquire's; a campaign that fails after it was granted
// resigns before it returns.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if len(value) > maxElectionValue {
		return nil, e.valueErr(value)
	}
	for tries := 1; ; tries++ {
		l, err := e.s.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			e.abandon(ctx, l)
			return nil, e.s.ctxError(err)
		}
		ok, err := e.change(ctx, "claim", l.acqID, value)
		switch {
		case err != nil:
			e.abandon(ctx, l)
			if cerr := engine.CtxErr(ctx); cerr != nil {
				err = cerr
			}
			return nil, e.fail("campaign", err)
		case ok:
			return &Leadership{e: e, lease: l}, nil
		}
		// Redis no longer records the lease it just granted (it expired
		// on the way, or the data was lost): campaign again.
		err = l.lost()
		if tries == 3 {
			return nil, err
		}
	}
}

// abandon gives back a lease a failed Campaign was granted, announcing no
// leader first in case its claim ran.
func (e *Election) abandon(ctx context.Context, l *Lease) {
	rctx, cancel := engine.Within(ctx, releaseTimeout)
	_, _ = e.change(rctx, "resign", l.acqID, "")
	cancel()
	_ = l.Release(ctx)
}

// Leader returns the current leader, or a Leader of Term 0 when nobody
// leads (a leader whose lease expired leads no more, even before anyone
// reclaimed it).
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	o := &observer{e: e, id: engine.NewAcqID(), after: -1}
	v, _, err := engine.Call(ctx, e.s.pool, o.call(0))
	r, err := parseObserveReply(v, err)
	if err != nil {
		return Leader{}, e.fail("read the leader of", err)
	}
	if len(r.changes) == 0 {
		return Leader{}, e.fail("read the leader of", fmt.Errorf("unexpected reply %v", v))
	}
	return r.changes[len(r.changes)-1], nil
}

// Observe calls f with the current leader (Term 0: none), then with every
// change after it (a new leader, a new value, no leader), in order, each
// once, until ctx ends: then it returns an error for which
// errors.Is(err, ctx.Err()) holds. It waits in Redis, with no command while
// nothing changes but one when the leader's lease deadline passes, so it
// learns of a resign at once and of a crashed leader within one TTL. After
// a connection error it reconnects and reads Redis again before it calls f,
// and goes on from the last change it reported (Redis keeps the last 100
// changes; after a longer gap, or a Redis that lost its data, f gets the
// current leader next). It returns other errors (a key of the wrong type,
// a refused command) at once. f runs on Observe's goroutine; changes made
// while it runs are delivered next.
func (e *Election) Observe(ctx context.Context, f func(Leader)) error {
	o := &observer{e: e, id: engine.NewAcqID(), after: -1, f: f}
	defer o.leave()
	backoff := 10 * time.Millisecond
	for {
		read, err := o.session(ctx)
		if cerr := engine.CtxErr(ctx); cerr != nil {
			return e.fail("observe", cerr)
		}
		if engine.IsRedisError(err) {
			return e.fail("observe", err)
		}
		if read {
			backoff = 10 * time.Millisecond
		}
		engine.Clk.WaitOrDone(ctx, nil, backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// observer is one Observe: its doorbell's id and the last change it
// reported.
type observer struct {
	e     *Election
	id    string
	epoch string // the leader record's epoch the last reply had
	after int64  // the last change's sequence number; -1: none yet
	f     func(Leader)
	last  Leader
	told  bool // f was called at least once, with last
}

// session reads and waits on one connection until it fails or ctx ends;
// read reports whether any read succeeded.
func (o *observer) session(ctx context.Context) (read bool, err error) {
	conn, err := o.e.s.block.GetContext(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	d := o.e.s.driver(nil)
	asked := d.BlockFor(ctx)
	r, err := parseObserveReply(engine.RunScript(ctx, conn, o.call(asked)))
	for err == nil {
		read = true
		o.deliver(r)
		if err := ctx.Err(); err != nil {
			return read, err
		}
		// A block cut short by the leader's lease deadline ends on a local
		// timer that rings the doorbell: Redis times a blocking command out
		// only on its cron tick (every 100ms at the default hz).
		var wake engine.Timer
		if r.block < asked {
			wake = engine.Clk.AfterFunc(r.block, func() { engine.Clk.Go(o.wake) })
		}
		asked = d.BlockFor(ctx)
		r, err = parseObserveReply(engine.BlockThenRun(ctx, conn, r.block, engine.BLPOP(o.e.bell(o.id)),
			o.call(asked)))
		if wake != nil {
			wake.Stop()
		}
	}
	return read, err
}

// wake rings the observer's own doorbell (election.lua "wake").
func (o *observer) wake() {
	ctx, cancel := engine.Within(context.Background(), time.Second)
	defer cancel()
	_, _ = o.e.change(ctx, "wake", o.id, "")
}

// deliver reports r's changes, but never the one reported last again.
func (o *observer) deliver(r observeReply) {
	o.epoch, o.after = r.epoch, r.seq
	for _, c := range r.changes {
		if o.told && c == o.last {
			continue
		}
		o.last, o.told = c, true
		if o.f != nil {
			o.f(c)
		}
	}
}

// leave takes the observer's registration back (else it lapses by itself
// within its block and the grace), waiting engine.SettleWait at most.
func (o *observer) leave() {
	done := make(chan struct{})
	engine.Clk.Go(func() {
		defer close(done)
		ctx, cancel := engine.Within(context.Background(), engine.SettleTimeout)
		defer cancel()
		_, _, _ = engine.Call(ctx, o.e.s.pool, o.call(0))
	})
	engine.Clk.WaitOrDone(context.Background(), done, engine.SettleWait)
}

func (o *observer) call(block time.Duration) engine.Run {
	return engine.ElectionObserve.With(append(o.e.keys(), o.e.bell(o.id)), engine.ObserveArgs{ObsID: o.id,
		Epoch: o.epoch, AfterSeq: o.after, BlockMs: block.Milliseconds(), GraceMs: o.e.s.cfg.grace.Milliseconds()})
}

// observeReply is election_observe.lua's reply, decoded.
type observeReply struct {
	block   time.Duration
	epoch   string
	seq     int64
	changes []Leader
}

func parseObserveReply(v interface{}, err error) (observeReply, error) {
	vals, err := redis.Values(v, err)
	if err != nil {
		return observeReply{}, err
	}
	var r observeReply
	var blockMs, nowUs int64
	if len(vals) < 4 || len(vals)%2 != 0 {
		return r, fmt.Errorf("unexpected reply %v", vals)
	}
	if _, err := redis.Scan(vals[:4], &blockMs, &nowUs, &r.epoch, &r.seq); err != nil {
		return r, err
	}
	r.block = time.Duration(blockMs) * time.Millisecond
	for i := 4; i < len(vals); i += 2 {
		var c Leader
		if _, err := redis.Scan(vals[i:i+2], &c.Term, &c.Value); err != nil {
			return r, err
		}
		r.changes = append(r.changes, c)
	}
	return r, nil
}

// keys are the six keys every election script takes (election_common.lua).
func (e *Election) keys() []interface{} {
	k := e.s.k
	return []interface{}{k.meta, k.leases, k.holders, k.base + "leader", k.base + "log", k.base + "observers"}
}

// bell is an observer's doorbell.
func (e *Election) bell(id string) string { return e.s.k.base + "ob:" + id }

// change runs election.lua's op for acquisition acq; ok is false when a
// claim finds acq's lease not current.
func (e *Election) change(ctx context.Context, op, acq, value string) (ok bool, err error) {
	v, _, err := engine.Call(ctx, e.s.pool, engine.Election.With(e.keys(),
		engine.ElectionArgs{Op: op, AcqID: acq, Value: value}))
	vals, err := redis.Values(v, err)
	if err != nil {
		return false, err
	}
	var code int64
	if _, err := redis.Scan(vals[:1], &code); err != nil {
		return false, err
	}
	return code == 1, nil
}

func (e *Election) fail(op string, err error) error {
	return engine.ScriptError(op, "election", e.s.name, err)
}

func (e *Election) valueErr(value string) error {
	return fmt.Errorf("redsem: election %q: a value of %d bytes, the limit is %d", engine.Printable(e.s.name), len(value), maxElectionValue)
}

// Context returns a context that ends when the leadership does: resigned,
// or lost (its lease expired or was found gone); context.Cause says why
// (ErrReleased after Resign). Derive the leader's work from it. A leader
// stalled past its lease (a GC pause, SIGSTOP) may act once more before its
// context ends (check Valid first): pass Term to the resource and have it
// refuse older terms.
func (l *Leadership) Context() context.Context {
	if l == nil {
		return (*Lease)(nil).Context()
	}
	return l.lease.Context()
}

// Valid reports whether the leadership still holds: not resigned, not
// lost, and its lease's local deadline not passed. Like Lease.Valid it reads
// the clock itself, so a leader resumed after a stop (SIGSTOP, a GC pause)
// sees it lost before its Context's timer has fired: check it before each
// act.
func (l *Leadership) Valid() bool {
	if l == nil {
		return false
	}
	return l.lease.Valid()
}

// Term returns the leadership's term, its fence: greater than the term of
// every earlier leadership of the election.
func (l *Leadership) Term() int64 {
	if l == nil {
		return 0
	}
	return l.lease.Fence()
}

// Proclaim changes the value the leader announces, without giving up the
// leadership: Observe reports it as a change of the same term. It returns
// ErrLeaseLost (and the leadership ends) when Redis no longer records it as
// the leader, the leadership's end (Lease.Err) once it ended.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	if l == nil {
		return ErrLeaseLost
	}
	if len(value) > maxElectionValue {
		return l.e.valueErr(value)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.lease.Err(); err != nil {
		return err
	}
	ok, err := l.e.change(ctx, "claim", l.lease.acqID, value)
	switch {
	case err != nil:
		return l.e.fail("proclaim", err)
	case !ok:
		return l.lease.lost()
	}
	return nil
}

// Resign gives the leadership up: observers learn at once that nobody
// leads, and the longest-waiting campaigner leads next. It returns nil, or
// Lease.Release's errors (ErrReleased when resigned already, ErrLeaseLost
// when it was lost). Like Release it ignores ctx's end, so `defer
// l.Resign(ctx)` works, and the leadership ends on this side whatever the
// outcome.
func (l *Leadership) Resign(ctx context.Context) error {
	if l == nil {
		return ErrLeaseLost
	}
	rctx, cancel := engine.Within(ctx, releaseTimeout)
	_, rerr := l.e.change(rctx, "resign", l.lease.acqID, "")
	cancel()
	if err := l.lease.Release(ctx); err != nil {
		return err
	}
	if rerr != nil {
		// Released, but observers learn of it only at the lease's
		// deadline.
		return l.e.fail("resign", rerr)
	}
	return nil
}
