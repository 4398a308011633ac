package redsem

import (
	"context"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// RWMutex is a read-write lock shared through Redis: any number of read
// leases at once, or one write lease, across every process that uses the
// same name and prefix. Requests are served first come, first served, with
// the readers at the head let in together, so a waiting writer is never
// starved (docs/rwmutex.md). Its leases are Leases, and its keys are not a
// Semaphore's: an RWMutex and a Semaphore of one name are two locks.
type RWMutex struct {
	s *Semaphore // pools, options, clock and key base of the lock's leases
}

// NewRWMutex returns the read-write lock called name. It checks its
// arguments and does no I/O. It refuses WithAdoptSize, WithWaitConnections
// and WithIdleExpiry (ErrInvalidOption): every waiting RLock or Lock blocks
// on a connection of its own, and its keys do not expire.
func NewRWMutex(pool Pool, name string, opts ...Option) (*RWMutex, error) {
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
	if cfg.adoptSize || cfg.waitSet || cfg.idle != 0 {
		return nil, fmt.Errorf("%w: WithAdoptSize, WithWaitConnections and WithIdleExpiry do not apply to an RWMutex", ErrInvalidOption)
	}
	cfg.waitConns = 0
	s := &Semaphore{pool: pool, block: pool, name: name, size: 1, cfg: cfg,
		k: keysAt(engine.KeyBase(cfg.prefix, name) + "rw:"), kind: rwLeases}
	if cfg.blockPool != nil {
		s.block = cfg.blockPool
	}
	s.maxBlock.Store(int64(engine.MaxBlock))
	return &RWMutex{s: s}, nil
}

// Name returns the lock's name as given to NewRWMutex.
func (m *RWMutex) Name() string { return m.s.name }

// TTL returns the lease TTL new leases get.
func (m *RWMutex) TTL() time.Duration { return m.s.cfg.ttl }

// RLock blocks until a read lease is granted and returns it, or until ctx
// ends: at once when no writer holds or waits, else behind them. When ctx
// ends first, errors.Is(err, ctx.Err()) holds and nothing is held or
// queued. Other errors are Acquire's.
func (m *RWMutex) RLock(ctx context.Context) (*Lease, error) { return m.lock(ctx, "r", true) }

// TryRLock returns a read lease if one can be granted now without jumping
// the queue (no writer holds, nobody waits), and ErrNoToken otherwise. It
// never waits; it is one round trip.
func (m *RWMutex) TryRLock(ctx context.Context) (*Lease, error) { return m.lock(ctx, "r", false) }

// Lock blocks until the write lease is granted and returns it, or until
// ctx ends: once every lease granted before it has ended and the waiters
// ahead of it were served. Errors as RLock's.
func (m *RWMutex) Lock(ctx context.Context) (*Lease, error) { return m.lock(ctx, "w", true) }

// TryLock returns the write lease if no lease is out and nobody waits, and
// ErrNoToken otherwise. It never waits; it is one round trip.
func (m *RWMutex) TryLock(ctx context.Context) (*Lease, error) { return m.lock(ctx, "w", false) }

func (m *RWMutex) lock(ctx context.Context, mode string, wait bool) (*Lease, error) {
	w := m.s.watch(ctx, map[string]string{"r": "rwmutex.read", "w": "rwmutex.write"}[mode])
	l, err := m.drive(ctx, mode, wait)
	return m.s.observeAcquire(w, l, err)
}

func (m *RWMutex) drive(ctx context.Context, mode string, wait bool) (*Lease, error) {
	dm := engine.ModeTry
	if wait {
		dm = engine.ModeWait
	}
	p := &rwSide{oneToken: oneToken{s: m.s}, mode: mode}
	res, err := engine.Drive(ctx, m.s.driver(p.fail), p, dm, nil)
	switch {
	case err != nil:
		return nil, err
	case res.Granted:
		return p.lease, nil
	}
	return nil, fmt.Errorf("%w: rwmutex %q is %s", ErrNoToken, engine.Printable(m.s.name), map[string]string{
		"r": "write-locked or has waiters", "w": "locked or has waiters"}[mode])
}

// rwLeases release and refresh an RWMutex's leases.
var rwLeases = &leaseKind{what: "rwmutex", release: &engine.RWRelease, refresh: &engine.RWRefresh,
	keys: func(k keys) []interface{} { return k.rw() }}

// rw returns the five keys every RWMutex script takes (rw_common.lua).
func (k keys) rw() []interface{} {
	return []interface{}{k.meta, k.leases, k.holders, k.queue(), k.waits}
}

// queue is an RWMutex's list of waiters, oldest first.
func (k keys) queue() string { return k.base + "queue" }

// rwSide is the protocol of one side of an RWMutex: rw_acquire.lua, behind
// BLPOP on the waiter's doorbell, and rw_abort.lua. Its replies are
// acquire.lua's, so a grant becomes a lease as a semaphore's does (the
// embedded oneToken's Accept).
type rwSide struct {
	oneToken
	mode string // "r" or "w"
}

func (p *rwSide) call(acq string, blockMs int64, phase string) engine.Run {
	s := p.s
	return engine.RWAcquire.With(append(s.k.rw(), s.k.bell(acq)), engine.RWAcquireArgs{AcqID: acq, Mode: p.mode,
		TTLMs: s.cfg.ttl.Milliseconds(), Label: s.cfg.label, BlockMs: blockMs, GraceMs: s.cfg.grace.Milliseconds(),
		Phase: phase})
}

func (p *rwSide) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (engine.Reply, error) {
	return parseRWReply(engine.RunScript(ctx, conn, p.call(acq, block.Milliseconds(), "fresh")))
}

// Wait writes BLPOP on the waiter's doorbell and rw_acquire.lua in one
// write: the script that lets this waiter in rings the doorbell, and Redis
// runs the script right behind the BLPOP, which confirms the grant before
// the client reads a byte.
func (p *rwSide) Wait(ctx context.Context, conn redis.Conn, acq string, r engine.Reply, next time.Duration) (engine.Reply, error) {
	return parseRWReply(engine.BlockThenRun(ctx, conn, r.Block, engine.BLPOP(p.s.k.bell(acq)),
		p.call(acq, next.Milliseconds(), "wait")))
}

func (p *rwSide) Abort(ctx context.Context, acq, mode string) (engine.Reply, error) {
	s := p.s
	v, _, err := engine.Call(ctx, s.pool, engine.RWAbort.With(append(s.k.rw(), s.k.bell(acq)),
		engine.RWAbortArgs{AcqID: acq, Mode: mode, TombMs: s.tombMs(), TTLMs: s.cfg.ttl.Milliseconds()}))
	return parseRWReply(v, err)
}

// parseRWReply is parseAcquireReply for a doorbell: a wait moves nothing,
// and a late wait's script finds its registration gone.
func parseRWReply(v interface{}, err error) (engine.Reply, error) {
	r, err := parseAcquireReply(v, err)
	r.Moves = false
	return r, err
}

func (p *rwSide) fail(err error) error {
	if engine.IsRedisError(err) {
		return p.s.scriptError("lock", err)
	}
	side := map[string]string{"r": "read", "w": "write"}[p.mode]
	return fmt.Errorf("redsem: %s-lock rwmutex %q: %w", side, engine.Printable(p.s.name), err)
}
