package httpgate

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
)

// Defaults of Config.
const (
	// DefaultIdleExpiry is how long a key's semaphore and rate gate stay
	// in Redis once idle, unless Config.IdleExpiry says otherwise.
	DefaultIdleExpiry = time.Minute
	// DefaultMaxKeys is how many keys a Limiter keeps objects for in
	// memory, unless Config.MaxKeys says otherwise.
	DefaultMaxKeys = 10_000
	// DownRetryAfter is the retry figure given while Redis fails: the
	// Retry-After of Handler's 503, and grpcgate's RetryInfo with
	// Unavailable. A fixed figure: nothing tells when Redis comes back.
	DownRetryAfter = time.Second
)

// Limit is what one key may have across the fleet: at most Slots requests
// in flight (a semaphore of that size), and at most N starts in any window
// of length Per (a rate gate). A zero field turns its half off.
type Limit struct {
	Slots int
	N     int
	Per   time.Duration
}

// Config says how a Limiter limits each key. Name is required, and a
// default Limit with at least one half on.
type Config struct {
	// Name starts the name of every key's semaphore and gate:
	// "<Name>:<key>" (a key that would make it longer than 512 bytes is
	// replaced by its SHA-256). Semaphores and gates of one name share
	// their state; give inbound and outbound Limiters distinct names.
	Name string
	// Limit is every key's limit unless Limits gives one.
	Limit Limit
	// Limits, if set, gives a key's own limit; a zero Limit means Limit.
	// It is asked once per key while the key stays in memory (MaxKeys).
	Limits func(key string) Limit
	// Wait is how long an acquisition waits for a slot and a start (the
	// slot is held while it waits for the start). 0 (the default) waits not
	// at all: what is not free now is refused. Negative waits as long as
	// the context allows. A wait ends as Redis failing once a PING on the
	// pool fails (checked every second while it waits); an acquisition
	// that does not wait ends so after 2s without Redis's replies (a pool
	// without read timeouts and a Redis that never answers must not hang
	// the request).
	Wait time.Duration
	// FailOpen lets requests through unlimited while Redis fails (any
	// error but a full key or the caller's context ending). Default: fail
	// closed, the request is refused (503).
	FailOpen bool
	// FullStatus is the HTTP status Handler answers a full key with:
	// http.StatusTooManyRequests (the default) or
	// http.StatusServiceUnavailable.
	FullStatus int
	// IdleExpiry is how long a key's semaphore stays in Redis with no
	// lease and no waiter (redsem.WithIdleExpiry), and its rate gate one
	// window after its last start with no waiter (rate.WithIdleExpiry);
	// default DefaultIdleExpiry.
	IdleExpiry time.Duration
	// MaxKeys bounds how many keys' semaphores and gates a Limiter keeps
	// in memory, least recently used dropped first; default
	// DefaultMaxKeys. A dropped key is made again on its next use, with
	// its state still in Redis.
	MaxKeys int
	// Options are given to every key's semaphore after the Limiter's own
	// (WithIdleExpiry): WithTTL, WithPrefix, WithObserver...
	Options []redsem.Option
	// RateOptions are given to every key's rate gate after the Limiter's
	// own (rate.WithIdleExpiry).
	RateOptions []rate.Option
}

// Limiter limits requests per key, fleet-wide: Acquire takes a key's slot
// and start, Handler does it for incoming HTTP requests and Transport for
// outgoing ones. It is safe for concurrent use; create one per limit and
// share it.
type Limiter struct {
	pool redsem.Pool
	cfg  Config

	mu   sync.Mutex
	keys map[string]*list.Element // of *limited
	lru  list.List                // most recently used first
}

// limited is one key's semaphore and gate, either nil when its half is off.
type limited struct {
	key  string
	sem  *redsem.Semaphore
	gate *rate.Gate
}

// FullError is Acquire's error when the key had no free slot or start (or
// none came within Config.Wait). Err is redsem.ErrNoToken,
// rate.ErrRateLimited (a start refused, or none within Wait) or
// context.DeadlineExceeded (no slot within Wait); RetryAfter is the gate's
// figure for a start, and 0 for a slot.
type FullError struct {
	Key        string
	RetryAfter time.Duration
	Err        error
}

func (e *FullError) Error() string {
	return fmt.Sprintf("httpgate: key %q is full: %v", e.Key, e.Err)
}

func (e *FullError) Unwrap() error { return e.Err }

// New returns a Limiter on pool. It checks cfg and does no I/O.
func New(pool redsem.Pool, cfg Config) (*Limiter, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: httpgate: empty Name", redsem.ErrInvalidOption)
	}
	if cfg.Limit.Slots == 0 && cfg.Limit.N == 0 {
		return nil, fmt.Errorf("%w: httpgate: the default Limit has neither Slots nor N", redsem.ErrInvalidOption)
	}
	if cfg.FullStatus == 0 {
		cfg.FullStatus = 429
	}
	if cfg.FullStatus != 429 && cfg.FullStatus != 503 {
		return nil, fmt.Errorf("%w: httpgate: FullStatus %d is neither 429 nor 503", redsem.ErrInvalidOption, cfg.FullStatus)
	}
	if cfg.IdleExpiry == 0 {
		cfg.IdleExpiry = DefaultIdleExpiry
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	l := &Limiter{pool: pool, cfg: cfg, keys: make(map[string]*list.Element)}
	if _, err := l.make("", cfg.Limit); err != nil { // checks the pool, the limit and the options
		return nil, err
	}
	return l, nil
}

// Acquire takes a slot of key's semaphore, then a start of its gate, as the
// key's limit has them, waiting as Config.Wait says. It returns the slot's
// lease (nil when the limit has no Slots, or when it failed open): release
// it when the work is done. Errors: a *FullError; the context's error when
// ctx ended (errors.Is(err, ctx.Err())); another error while Redis fails,
// unless Config.FailOpen. On error nothing is held.
func (l *Limiter) Acquire(ctx context.Context, key string) (*redsem.Lease, error) {
	k, err := l.get(key)
	if err != nil {
		return nil, err
	}
	wait := l.cfg.Wait != 0
	var wctx context.Context
	var cancel context.CancelFunc
	switch {
	case !wait:
		// Nothing to wait for, but a Redis that never replies, behind a
		// pool without timeouts, would hold the request forever: past
		// noWaitBound it counts as down.
		wctx, cancel = context.WithTimeoutCause(ctx, noWaitBound, errRedisSilent)
	case l.cfg.Wait > 0:
		wctx, cancel = context.WithTimeout(ctx, l.cfg.Wait)
	default:
		wctx, cancel = ctx, func() {}
	}
	defer cancel()
	if wait {
		// The library's waits outlast an unreachable Redis; the middleware
		// must not (docs/middleware.md), so a watch ends them.
		var stop func()
		wctx, stop = l.watchRedis(wctx)
		defer stop()
	}
	var lease *redsem.Lease
	if k.sem != nil {
		if wait {
			lease, err = k.sem.Acquire(wctx)
		} else {
			lease, err = k.sem.TryAcquire(wctx)
		}
		if err != nil {
			return nil, l.refused(ctx, wctx, key, 0, err)
		}
	}
	if k.gate != nil {
		var st rate.Start
		if wait {
			st, err = k.gate.Wait(wctx)
			if err != nil && engine.CtxErr(ctx) == nil && engine.CtxErr(wctx) != nil && !errors.Is(context.Cause(wctx), errRedisDown) {
				// Wait ran out without a start, and without a figure: one
				// Allow (which never jumps the queue) takes a start freed
				// meanwhile, or says when one is due.
				st, err = k.gate.Allow(ctx)
			}
		} else {
			st, err = k.gate.Allow(wctx)
		}
		if err != nil {
			if err = l.refused(ctx, wctx, key, st.RetryAfter, err); err != nil {
				release(ctx, lease)
				return nil, err
			}
		}
	}
	return lease, nil
}

// Hold is Acquire for work that runs under a context: it returns a child
// of ctx that is cancelled when the lease is lost (context.Cause says why),
// and release, which gives the slot back and cancels that context. Call
// release once, when the work is done; on error nothing is held and
// release is nil.
func (l *Limiter) Hold(ctx context.Context, key string) (context.Context, func(), error) {
	lease, err := l.Acquire(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	hctx, cancel := context.WithCancelCause(ctx)
	if lease == nil {
		return hctx, func() { cancel(context.Canceled) }, nil
	}
	stop := context.AfterFunc(lease.Context(), func() { cancel(context.Cause(lease.Context())) })
	return hctx, func() {
		stop()
		release(ctx, lease)
		cancel(context.Canceled)
	}, nil
}

// refused maps a failed acquisition's err: nil when it fails open.
func (l *Limiter) refused(ctx, wctx context.Context, key string, retry time.Duration, err error) error {
	switch {
	case engine.CtxErr(ctx) != nil: // the caller's own context ended
		return err
	case errors.Is(err, redsem.ErrNoToken), errors.Is(err, rate.ErrRateLimited):
		return &FullError{Key: key, RetryAfter: retry, Err: err}
	case errors.Is(context.Cause(wctx), errRedisDown):
		if l.cfg.FailOpen {
			return nil
		}
		return fmt.Errorf("httpgate: key %q: %w", key, context.Cause(wctx))
	case engine.CtxErr(wctx) != nil: // its deadline passed, if its timer has not fired yet
		return &FullError{Key: key, RetryAfter: retry, Err: context.DeadlineExceeded}
	case l.cfg.FailOpen:
		return nil
	}
	return fmt.Errorf("httpgate: key %q: %w", key, err)
}

// errRedisDown ends a wait whose watch found Redis unreachable, and, as
// errRedisSilent, an acquisition that does not wait past noWaitBound.
var errRedisDown = errors.New("httpgate: Redis unreachable")

// redisCheck is how often watchRedis pings Redis while a request waits, and
// how long a ping may take.
const redisCheck = time.Second

// noWaitBound is how long an acquisition that does not wait (Config.Wait 0)
// may take before Redis counts as down: as long as a waiting one's watch
// takes, at most, to find a silent Redis.
const noWaitBound = 2 * redisCheck

// errRedisSilent ends an acquisition that does not wait once noWaitBound
// has passed without Redis's replies.
var errRedisSilent = fmt.Errorf("%w: no reply within %v", errRedisDown, noWaitBound)

// watchRedis returns a child of wctx that ends with errRedisDown when a PING
// on the pool fails while it lives (checked every redisCheck, the first
// after one), and stop, which ends the watch.
func (l *Limiter) watchRedis(wctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(wctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(redisCheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := l.ping(ctx); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("%w: %w", errRedisDown, err))
				return
			}
		}
	}()
	return ctx, func() {
		cancel(context.Canceled)
		<-done
	}
}

// ping sends a PING on one of the pool's connections, within redisCheck.
func (l *Limiter) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, redisCheck)
	defer cancel()
	c, err := l.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = redis.DoContext(c, ctx, "PING")
	return err
}

// release gives lease back, even once ctx has ended (Lease.Release bounds
// itself); nil is nothing held. A Release that fails leaves the slot taken
// in Redis until the lease's TTL passes (WithTTL, default 30s) at most.
func release(ctx context.Context, lease *redsem.Lease) {
	if lease != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
	}
}

// get returns key's semaphore and gate, made on first use and kept while
// the key is among the MaxKeys most recently used.
func (l *Limiter) get(key string) (*limited, error) {
	l.mu.Lock()
	if e, ok := l.keys[key]; ok {
		l.lru.MoveToFront(e)
		l.mu.Unlock()
		return e.Value.(*limited), nil
	}
	l.mu.Unlock()
	limit := l.cfg.Limit
	if l.cfg.Limits != nil {
		if own := l.cfg.Limits(key); own != (Limit{}) {
			limit = own
		}
	}
	k, err := l.make(key, limit)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.keys[key]; ok { // made meanwhile by another request
		l.lru.MoveToFront(e)
		return e.Value.(*limited), nil
	}
	l.keys[key] = l.lru.PushFront(k)
	for l.lru.Len() > l.cfg.MaxKeys {
		old := l.lru.Remove(l.lru.Back()).(*limited)
		delete(l.keys, old.key)
	}
	return k, nil
}

// make returns key's semaphore and gate for limit; it does no I/O.
func (l *Limiter) make(key string, limit Limit) (*limited, error) {
	name := keyName(l.cfg.Name, key)
	k := &limited{key: key}
	var err error
	if limit.Slots != 0 {
		opts := append([]redsem.Option{redsem.WithIdleExpiry(l.cfg.IdleExpiry)}, l.cfg.Options...)
		if k.sem, err = redsem.NewSemaphore(l.pool, name, limit.Slots, opts...); err != nil {
			return nil, fmt.Errorf("httpgate: key %q: %w", key, err)
		}
	}
	if limit.N != 0 {
		opts := append([]rate.Option{rate.WithIdleExpiry(l.cfg.IdleExpiry)}, l.cfg.RateOptions...)
		if k.gate, err = rate.New(l.pool, name, limit.N, limit.Per, opts...); err != nil {
			return nil, fmt.Errorf("httpgate: key %q: %w", key, err)
		}
	}
	return k, nil
}

// keyName is the semaphore and gate name of key: "<name>:<key>", or
// "<name>:sha256:<hex>" when that would be too long.
func keyName(name, key string) string {
	n := name + ":" + key
	if len(n) > rate.MaxNameLen {
		sum := sha256.Sum256([]byte(key))
		n = name + ":sha256:" + hex.EncodeToString(sum[:])
	}
	return n
}
