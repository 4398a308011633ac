package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsredigo "github.com/go-redsync/redsync/v4/redis/redigo"
	"github.com/gomodule/redigo/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/bench/leasefloor"
)

// A lib is one way to lock: redsem, a peer library at one setting, or a floor
// written here from raw Redis commands.
type lib struct {
	name string
	kind string // "redsem", "floor" or "peer"
	// sem: it can be a semaphore of size > 1. blocking: waiters sleep in
	// Redis (BLPOP/BLMOVE) rather than poll, so INFO blocked_clients shows them.
	sem, blocking bool
	// sharedWait: waiters of one client queue in the process behind one
	// blocking call, so INFO blocked_clients shows one, not one per waiter.
	sharedWait bool
	// settle is how long, in the handoff scenario, the holder keeps the lock
	// after the waiter started (plus a uniform jitter of up to jitter), so
	// that a poller's retry phase is random when the lock is released. Slow
	// pollers run their handoff trials on parallel independent pairs.
	settle, jitter time.Duration
	parallel       int
	// prepare, when set, readies a lock's keys on the server before a
	// scenario uses it (conn is the harness's own, uncounted).
	prepare func(conn redis.Conn, key string, size int) error
	// in, when set, lists the prefixes of the only scenarios it takes part in.
	in []string
	// functions: it calls the Function libraries that the run loads at its
	// start (leasefloor.LoadFunctions, Redis 7.0+).
	functions bool
	newClient func(addr string, c *counters, shared bool) (client, error)
}

// A client is one library instance with its own connections: one per
// goroutine in the contended scenarios, one shared in the waiting-cost one.
type client interface {
	// locker returns a lock on key, of size tokens (1: a mutex).
	locker(key string, size int) (locker, error)
	// warm dials a connection so that dialing stays out of measurements.
	warm(ctx context.Context) error
	close()
}

type locker interface {
	// lock waits until it holds the lock, or ctx ends, and returns the
	// function that releases it.
	lock(ctx context.Context) (release func(context.Context) error, err error)
}

const peerTTL = 10 * time.Second

func libs() []*lib {
	// The lease floors take part where the handoff chain is measured.
	chain := []string{"uncontended", "contended/", "handoff", "semaphore/"}
	return []*lib{
		{name: "redsem", kind: "redsem", sem: true, blocking: true, sharedWait: true, jitter: time.Millisecond, parallel: 1, newClient: newRedsem(1)},
		{name: "redsem:per-waiter", kind: "redsem", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1,
			in: []string{"uncontended", "handoff", "waiting/", "contended/64/hold1ms"}, newClient: newRedsem(0)},
		{name: "floor:ping", kind: "floor", in: []string{"uncontended"}, parallel: 1, newClient: newPing},
		{name: "floor:blpop", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, prepare: prepareRaw, newClient: newRaw},
		{name: "floor:lease", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.Lease.Prepare, newClient: newLeaseFloor(leasefloor.Lease)},
		{name: "floor:onerecord", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.OneRecord.Prepare, newClient: newLeaseFloor(leasefloor.OneRecord)},
		{name: "floor:onerecord-fcall", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain, functions: true,
			prepare: leasefloor.OneRecordFCall.Prepare, newClient: newLeaseFloor(leasefloor.OneRecordFCall)},
		{name: "floor:pipeline", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain, functions: true,
			prepare: leasefloor.Pipeline.Prepare, newClient: newLeaseFloor(leasefloor.Pipeline)},
		{name: "floor:register", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.Register.Prepare, newClient: newLeaseFloor(leasefloor.Register)},
		{name: "floor:queued", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.Queued.Prepare, newClient: newLeaseFloor(leasefloor.Queued)},
		{name: "floor:held", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.Held.Prepare, newClient: newLeaseFloor(leasefloor.Held)},
		{name: "floor:kept", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.Kept.Prepare, newClient: newLeaseFloor(leasefloor.Kept)},
		{name: "floor:noscript", kind: "floor", sem: true, blocking: true, jitter: time.Millisecond, parallel: 1, in: chain,
			prepare: leasefloor.NoScript.Prepare, newClient: newLeaseFloor(leasefloor.NoScript)},
		{name: "redsync:default", kind: "peer", settle: 500 * time.Millisecond, jitter: 250 * time.Millisecond, parallel: 50,
			newClient: redsyncClient()},
		{name: "redsync:1ms", kind: "peer", settle: 5 * time.Millisecond, jitter: time.Millisecond, parallel: 1,
			newClient: redsyncClient(redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(1<<30))},
		{name: "redislock:100ms", kind: "peer", settle: 300 * time.Millisecond, jitter: 100 * time.Millisecond, parallel: 50,
			newClient: redislockClient(100 * time.Millisecond)},
		{name: "redislock:1ms", kind: "peer", settle: 5 * time.Millisecond, jitter: time.Millisecond, parallel: 1,
			newClient: redislockClient(time.Millisecond)},
		// rueidislock waits for Redis's invalidation of the key it tracks
		// (client-side caching), not on a timer: 5 ms settles its failed try.
		{name: "rueidislock", kind: "peer", settle: 5 * time.Millisecond, jitter: time.Millisecond, parallel: 1,
			newClient: rueidislockClient},
	}
}

// newRedigoPool returns a counting redigo pool. A per-goroutine pool keeps
// one connection; a shared one keeps up to 64 idle and opens as many as asked.
func newRedigoPool(addr string, c *counters, shared bool) *countingPool {
	idle := 1
	if shared {
		idle = 64
	}
	return &countingPool{c: c, pool: &redis.Pool{
		MaxIdle: idle,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr,
				redis.DialConnectTimeout(5*time.Second), redis.DialReadTimeout(30*time.Second),
				redis.DialWriteTimeout(5*time.Second))
		},
	}}
}

func warmRedigo(ctx context.Context, p *countingPool) error {
	conn, err := p.pool.GetContext(ctx) // uncounted
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = redis.DoContext(conn, ctx, "PING")
	return err
}

// redsem

// redsemClient keeps one Semaphore per key, as an application would, so
// that goroutines sharing a client share waiting (WithWaitConnections).
type redsemClient struct {
	pool  *countingPool
	conns int
	mu    sync.Mutex
	sems  map[string]*redsem.Semaphore
}

// newRedsem makes redsem clients whose semaphores share conns blocking
// calls among their waiters (0: one connection per waiter).
func newRedsem(conns int) func(addr string, c *counters, shared bool) (client, error) {
	return func(addr string, c *counters, shared bool) (client, error) {
		return &redsemClient{pool: newRedigoPool(addr, c, shared), conns: conns, sems: map[string]*redsem.Semaphore{}}, nil
	}
}

func (r *redsemClient) warm(ctx context.Context) error { return warmRedigo(ctx, r.pool) }
func (r *redsemClient) close()                         { r.pool.Close() }

func (r *redsemClient) locker(key string, size int) (locker, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.sems[key]; ok {
		return redsemLocker{s}, nil
	}
	s, err := redsem.NewSemaphore(r.pool, key, size, redsem.WithWaitConnections(r.conns))
	if err != nil {
		return nil, err
	}
	r.sems[key] = s
	return redsemLocker{s}, nil
}

type redsemLocker struct{ s *redsem.Semaphore }

func (l redsemLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	lease, err := l.s.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return lease.Release, nil
}

// floor:ping — a "pair" is two PINGs: the least any two-round-trip
// acquire+release can cost.

type pingClient struct{ pool *countingPool }

func newPing(addr string, c *counters, shared bool) (client, error) {
	return &pingClient{pool: newRedigoPool(addr, c, shared)}, nil
}

func (p *pingClient) warm(ctx context.Context) error     { return warmRedigo(ctx, p.pool) }
func (p *pingClient) close()                             { p.pool.Close() }
func (p *pingClient) locker(string, int) (locker, error) { return p, nil }
func (p *pingClient) ping(ctx context.Context) error     { return p.do(ctx, "PING") }
func (p *pingClient) do(ctx context.Context, cmd string) error {
	conn, err := p.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = redis.DoContext(conn, ctx, cmd)
	return err
}

func (p *pingClient) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := p.ping(ctx); err != nil {
		return nil, err
	}
	return p.ping, nil
}

// floor:blpop — a list of tokens, BLPOP to take one, LPUSH to give it back:
// the least any BLPOP-based semaphore can cost. No leases, no fencing, no
// crash recovery.

type rawClient struct{ pool *countingPool }

func newRaw(addr string, c *counters, shared bool) (client, error) {
	return &rawClient{pool: newRedigoPool(addr, c, shared)}, nil
}

func (r *rawClient) warm(ctx context.Context) error { return warmRedigo(ctx, r.pool) }
func (r *rawClient) close()                         { r.pool.Close() }

func (r *rawClient) locker(key string, size int) (locker, error) {
	return rawLocker{pool: r.pool, key: key}, nil
}

// prepareRaw fills the token list of a raw lock; the harness calls it once.
func prepareRaw(conn redis.Conn, key string, size int) error {
	args := []interface{}{key}
	for i := 1; i <= size; i++ {
		args = append(args, strconv.Itoa(i))
	}
	if _, err := conn.Do("DEL", key); err != nil {
		return err
	}
	_, err := conn.Do("RPUSH", args...)
	return err
}

type rawLocker struct {
	pool *countingPool
	key  string
}

func (l rawLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	conn, err := l.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	v, err := redis.Strings(redis.DoContext(conn, ctx, "BLPOP", l.key, 0))
	conn.Close()
	if err != nil {
		return nil, err
	}
	tok := v[1]
	return func(ctx context.Context) error {
		conn, err := l.pool.GetContext(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = redis.DoContext(conn, ctx, "LPUSH", l.key, tok)
		return err
	}, nil
}

// The lease floors — floor:blpop plus one of redsem's promises (package
// leasefloor), each lock call on a connection of the pool's.

type leaseClient struct {
	pool *countingPool
	f    leasefloor.Floor
}

func newLeaseFloor(f leasefloor.Floor) func(addr string, c *counters, shared bool) (client, error) {
	return func(addr string, c *counters, shared bool) (client, error) {
		return &leaseClient{pool: newRedigoPool(addr, c, shared), f: f}, nil
	}
}

func (l *leaseClient) warm(ctx context.Context) error { return warmRedigo(ctx, l.pool) }
func (l *leaseClient) close()                         { l.pool.Close() }

func (l *leaseClient) locker(key string, size int) (locker, error) {
	return leaseLocker{l, l.f.Lock(key)}, nil
}

type leaseLocker struct {
	l  *leaseClient
	lk *leasefloor.Lock
}

func (k leaseLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	conn, err := k.l.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	rel, err := k.lk.Acquire(ctx, conn)
	conn.Close()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		conn, err := k.l.pool.GetContext(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		return rel(ctx, conn)
	}, nil
}

// redsync with the redigo pool adapter.

type redsyncCl struct {
	pool *countingPool
	rs   *redsync.Redsync
	opts []redsync.Option
}

func redsyncClient(opts ...redsync.Option) func(string, *counters, bool) (client, error) {
	return func(addr string, c *counters, shared bool) (client, error) {
		p := newRedigoPool(addr, c, shared)
		return &redsyncCl{pool: p, rs: redsync.New(rsredigo.NewPool(p)), opts: append([]redsync.Option{redsync.WithExpiry(peerTTL)}, opts...)}, nil
	}
}

func (r *redsyncCl) warm(ctx context.Context) error { return warmRedigo(ctx, r.pool) }
func (r *redsyncCl) close()                         { r.pool.Close() }

func (r *redsyncCl) locker(key string, size int) (locker, error) {
	if size != 1 {
		return nil, errors.New("redsync has no semaphores")
	}
	return redsyncLocker{m: r.rs.NewMutex(key, r.opts...)}, nil
}

type redsyncLocker struct{ m *redsync.Mutex }

func (l redsyncLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	for {
		// LockContext gives up after its tries (32 by default, 50-250ms
		// apart): a caller that must have the lock calls it again.
		err := l.m.LockContext(ctx)
		if err == nil {
			return func(ctx context.Context) error {
				ok, err := l.m.UnlockContext(ctx)
				if err == nil && !ok {
					err = errors.New("redsync: unlock failed")
				}
				return err
			}, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var taken *redsync.ErrTaken
		if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, &taken) {
			return nil, err
		}
	}
}

// redislock with go-redis v9 and a linear retry.

type redislockCl struct {
	rdb   *goredis.Client
	rl    *redislock.Client
	retry time.Duration
}

func redislockClient(retry time.Duration) func(string, *counters, bool) (client, error) {
	return func(addr string, c *counters, shared bool) (client, error) {
		opt := &goredis.Options{Addr: addr, ReadTimeout: 30 * time.Second}
		if !shared {
			opt.PoolSize = 1
		}
		rdb := goredis.NewClient(opt)
		rdb.AddHook(countingHook{c})
		return &redislockCl{rdb: rdb, rl: redislock.New(rdb), retry: retry}, nil
	}
}

func (r *redislockCl) warm(ctx context.Context) error { return r.rdb.Ping(ctx).Err() }
func (r *redislockCl) close()                         { r.rdb.Close() }

func (r *redislockCl) locker(key string, size int) (locker, error) {
	if size != 1 {
		return nil, errors.New("redislock has no semaphores")
	}
	return redislockLocker{r: r, key: key}, nil
}

type redislockLocker struct {
	r   *redislockCl
	key string
}

func (l redislockLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	for {
		lk, err := l.r.rl.Obtain(ctx, l.key, peerTTL, &redislock.Options{RetryStrategy: redislock.LinearBackoff(l.r.retry)})
		if err == nil {
			return lk.Release, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, redislock.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("redislock: %w", err)
		}
	}
}

// rueidislock on its own rueidis client, as its README has it for one
// Redis: KeyMajority 1, NoLoopTracking (Redis 7.0.5+).

type rueidislockCl struct {
	raw rueidis.Client // uncounted, to warm up
	lk  rueidislock.Locker
}

func rueidislockClient(addr string, c *counters, shared bool) (client, error) {
	cl := &rueidislockCl{}
	lk, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}, ConnWriteTimeout: 30 * time.Second},
		KeyValidity:    peerTTL,
		KeyMajority:    1,
		NoLoopTracking: true,
		ClientBuilder: func(o rueidis.ClientOption) (rueidis.Client, error) {
			raw, err := rueidis.NewClient(o)
			cl.raw = raw
			return countingRueidis{raw, c}, err
		},
	})
	if err != nil {
		return nil, err
	}
	cl.lk = lk
	return cl, nil
}

func (r *rueidislockCl) warm(ctx context.Context) error {
	return r.raw.Do(ctx, r.raw.B().Ping().Build()).Error()
}
func (r *rueidislockCl) close() { r.lk.Close() }

func (r *rueidislockCl) locker(key string, size int) (locker, error) {
	if size != 1 {
		return nil, errors.New("rueidislock has no semaphores")
	}
	return rueidislockLocker{r.lk, key}, nil
}

type rueidislockLocker struct {
	lk  rueidislock.Locker
	key string
}

// lock holds the lock until the release cancels its context; the cancel
// returns once the key is deleted.
func (l rueidislockLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	_, cancel, err := l.lk.WithContext(ctx, l.key)
	if err != nil {
		return nil, fmt.Errorf("rueidislock: %w", err)
	}
	return func(context.Context) error { cancel(); return nil }, nil
}
