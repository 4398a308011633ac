package sentinel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/cluster"
	"github.com/redsem/redsem/internal/errconn"
)

// Pool is a connection source for a master watched by Redis Sentinel. It
// finds the master through the sentinels, dials it through a redigo pool
// (checking ROLE on every new connection) and follows failovers without a
// restart. It satisfies redsem.Pool, so a Semaphore or Mutex built on it
// works unchanged, and it can serve as a redsem.WithBlockingPool as well. A
// Pool is safe for concurrent use; its connections are not, as with redigo.
type Pool struct {
	cfg       config
	name      string
	sentinels []string
	wait      *cluster.WaitPool // with WithWait: GetContext goes through it

	askMu sync.Mutex // one discovery at a time

	mu      sync.Mutex
	master  string                // "" when unknown
	last    string                // the last master installed
	np      *redis.Pool           // the pool of master
	raw     map[redis.Conn]string // connections dialled, by node address
	held    bool                  // a failover is under way: use no master
	gen     uint64                // counts changes of master and hold
	closed  bool
	changed chan struct{} // closed, and replaced, when master or held change
	subs    map[redis.Conn]struct{}
	stop    chan struct{}
	bg      sync.WaitGroup

	stats struct {
		switches, discoveries, notMaster, connErrors, holds atomic.Int64
	}
}

// New returns a Pool for the master that the sentinels at addrs
// (host:port of any of them) monitor under name. It waits, within ctx and
// WithFailoverWait, until one of them names a master that answers ROLE as a
// master, so that a client started during a failover waits for its end
// instead of failing. It fails with ErrUnknownMaster when the sentinels
// monitor no such name, ErrNoMaster when none answers in time, or an error
// for an invalid option.
func New(ctx context.Context, addrs []string, name string, opts ...Option) (*Pool, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("redsem/sentinel: no sentinel addresses")
	}
	if name == "" {
		return nil, fmt.Errorf("redsem/sentinel: empty master name")
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	p := &Pool{
		cfg: cfg, name: name, sentinels: append([]string(nil), addrs...),
		raw: map[redis.Conn]string{}, subs: map[redis.Conn]struct{}{},
		changed: make(chan struct{}), stop: make(chan struct{}),
	}
	if cfg.waitReplicas > 0 {
		if p.wait, err = cluster.NewWaitPool(source{p}, cfg.waitReplicas, cfg.waitTimeout); err != nil {
			return nil, err
		}
	}
	for _, a := range p.sentinels {
		p.bg.Add(1)
		go p.watch(a)
	}
	c, err := p.get(ctx)
	if err != nil {
		p.Close()
		return nil, err
	}
	c.Close()
	return p, nil
}

// GetContext returns a connection to the current master. When no master is
// known (at start, after a failover began or after the master failed) it
// asks the sentinels and waits, within ctx and WithFailoverWait, until one
// is reachable; it then fails with ErrNoMaster, joined with ctx's error when
// ctx ended the wait. Close the connection after use, as with any redigo
// connection.
func (p *Pool) GetContext(ctx context.Context) (redis.Conn, error) {
	if p.wait != nil {
		return p.wait.GetContext(ctx)
	}
	return p.get(ctx)
}

// source is the Pool without WAIT, for the WaitPool that adds it.
type source struct{ p *Pool }

func (s source) GetContext(ctx context.Context) (redis.Conn, error) { return s.p.get(ctx) }

// Get is GetContext without a context, for code written against
// redis.Pool. Errors are reported by the connection's methods.
func (p *Pool) Get() redis.Conn {
	c, err := p.GetContext(context.Background())
	if err != nil {
		return errconn.New(err)
	}
	return c
}

// Master returns the address of the master in use, or "" while none is
// (during a failover).
func (p *Pool) Master() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.master
}

// Stats counts what the Pool has done since New.
type Stats struct {
	Switches    int64 // changes of the master in use
	Discoveries int64 // master look-ups answered by the sentinels
	NotMaster   int64 // new connections refused because ROLE was not master
	ConnErrors  int64 // connection failures and failover replies seen
	Holds       int64 // failovers announced by a sentinel (+try-failover)
}

// Stats returns the Pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{
		Switches: p.stats.switches.Load(), Discoveries: p.stats.discoveries.Load(),
		NotMaster: p.stats.notMaster.Load(), ConnErrors: p.stats.connErrors.Load(),
		Holds: p.stats.holds.Load(),
	}
}

// Close stops watching the sentinels and closes every connection to the
// master, in use or idle. New connections fail with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.stop)
	subs := p.subs
	p.subs = map[redis.Conn]struct{}{}
	np, raw := p.dropLocked(func(string) bool { return true })
	p.mu.Unlock()
	for c := range subs {
		c.Close()
	}
	p.bg.Wait()
	closeAll(np, raw)
	return nil
}

// get returns a connection to the master, waiting for one as GetContext
// documents.
func (p *Pool) get(ctx context.Context) (redis.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.failoverWait)
	defer cancel()
	var lastErr error
	for n := 0; ; n++ {
		np, addr, changed, err := p.current(wctx)
		if err == nil {
			var c redis.Conn
			if c, err = np.GetContext(wctx); err == nil {
				return &conn{p: p, inner: c, addr: addr}, nil
			}
			if wctx.Err() == nil {
				p.stats.connErrors.Add(1)
				p.forget(addr, errors.Is(err, ErrNotMaster))
			}
		}
		if errors.Is(err, ErrClosed) || errors.Is(err, ErrUnknownMaster) {
			return nil, err
		}
		if refused(err) {
			// A password or ACL problem does not pass with time.
			return nil, fmt.Errorf("%w: %v", ErrNoMaster, err)
		}
		if dl, _ := wctx.Deadline(); lastErr == nil || time.Now().Before(dl) {
			lastErr = err // not one the end of the wait caused
		}
		if perr := pause(wctx, n, changed); perr != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, fmt.Errorf("%w: %w (last: %v)", ErrNoMaster, cerr, lastErr)
			}
			return nil, fmt.Errorf("%w within %v: %v", ErrNoMaster, p.cfg.failoverWait, lastErr)
		}
	}
}

// errFailoverRunning is what current reports while a sentinel runs a
// failover of the master.
var errFailoverRunning = errors.New("a failover is under way")

// current returns the pool of the master, asking the sentinels when none
// is known, and the channel that is closed at the next change.
func (p *Pool) current(ctx context.Context) (*redis.Pool, string, chan struct{}, error) {
	p.mu.Lock()
	np, addr, held, closed, changed := p.np, p.master, p.held, p.closed, p.changed
	p.mu.Unlock()
	if closed {
		return nil, "", nil, ErrClosed
	}
	if np != nil && !held {
		return np, addr, changed, nil
	}
	p.askMu.Lock()
	defer p.askMu.Unlock()
	p.mu.Lock()
	np, addr, held, changed = p.np, p.master, p.held, p.changed
	gen := p.gen
	p.mu.Unlock()
	if np != nil && !held {
		return np, addr, changed, nil // found while we waited for askMu
	}
	addr, running, err := p.ask(ctx)
	if err != nil {
		return nil, "", changed, err
	}
	p.stats.discoveries.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, "", nil, ErrClosed
	case p.gen != gen:
		// An event came during the question (a failover began, or a new
		// master was named): the answer may predate it.
		return nil, "", changed, errStale
	case running:
		p.held = true
		return nil, "", changed, fmt.Errorf("%w (sentinels still name %s)", errFailoverRunning, addr)
	}
	p.installLocked(addr)
	return p.np, addr, p.changed, nil
}

// errStale is what current reports when the master or the hold changed
// while it asked the sentinels.
var errStale = errors.New("the sentinels' answer predates a failover event")

// install makes addr the master, with a fresh pool, and ends any hold. The
// connections to the previous master, idle or in use, are closed. It
// returns nil after Close.
func (p *Pool) install(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.installLocked(addr)
	}
}

func (p *Pool) installLocked(addr string) {
	if p.master != addr || p.np == nil {
		if p.last != "" && p.last != addr {
			p.stats.switches.Add(1)
		}
		p.last = addr
		np, raw := p.dropLocked(func(a string) bool { return a != addr })
		p.master, p.np = addr, p.newNodePool(addr)
		// Not under p.mu: closing a TLS connection may write.
		go closeAll(np, raw)
	}
	p.held = false
	p.signalLocked()
}

// forget drops addr as the master, when it still is, after a connection to
// it failed or it answered as a replica: the next GetContext asks the
// sentinels again. Its idle connections are closed; with demoted (it
// answered as a replica) those in use too, otherwise they stay theirs.
func (p *Pool) forget(addr string, demoted bool) {
	p.mu.Lock()
	if p.master != addr {
		p.mu.Unlock()
		return
	}
	np, raw := p.dropLocked(func(a string) bool { return demoted && a == addr })
	p.signalLocked()
	p.mu.Unlock()
	closeAll(np, raw)
}

// hold stops the use of the master because a sentinel announced a
// failover of it: every connection to it is closed, and GetContext waits
// until the sentinels name a master with no failover running.
func (p *Pool) hold() {
	p.stats.holds.Add(1)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.held = true
	np, raw := p.dropLocked(func(string) bool { return true })
	p.signalLocked()
	p.mu.Unlock()
	closeAll(np, raw)
}

// unhold ends a hold after a sentinel gave up its failover: the next
// GetContext asks the sentinels again.
func (p *Pool) unhold() {
	p.mu.Lock()
	p.held = false
	p.signalLocked()
	p.mu.Unlock()
}

// dropLocked forgets the master and its pool, and takes out of p.raw the
// connections to the nodes for which cut holds, for closeAll to close.
func (p *Pool) dropLocked(cut func(addr string) bool) (*redis.Pool, []redis.Conn) {
	np := p.np
	p.master, p.np = "", nil
	var raw []redis.Conn
	for c, a := range p.raw {
		if cut(a) {
			raw = append(raw, c)
			delete(p.raw, c)
		}
	}
	return np, raw
}

func (p *Pool) signalLocked() {
	p.gen++
	close(p.changed)
	p.changed = make(chan struct{})
}

// closeAll closes a dropped pool and every connection it dialled, in use
// or not: a waiter blocked on a demoted or partitioned master must not be
// served there.
func closeAll(np *redis.Pool, raw []redis.Conn) {
	if np != nil {
		np.Close()
	}
	for _, c := range raw {
		c.Close()
	}
}

func (p *Pool) newNodePool(addr string) *redis.Pool {
	return &redis.Pool{
		MaxIdle:     p.cfg.maxIdle,
		MaxActive:   p.cfg.maxActive,
		Wait:        p.cfg.maxActive > 0,
		IdleTimeout: 5 * time.Minute,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return p.dial(ctx, addr)
		},
	}
}

// dial connects to addr and checks with ROLE that it is a master: a
// demoted master answers commands until it learns of the failover.
func (p *Pool) dial(ctx context.Context, addr string) (redis.Conn, error) {
	opts := append([]redis.DialOption{redis.DialConnectTimeout(5 * time.Second)}, p.cfg.dialOpts...)
	c, err := redis.DialContext(ctx, "tcp", addr, opts...)
	if err != nil {
		return nil, err
	}
	role, err := redis.Values(redis.DoContext(c, ctx, "ROLE"))
	if err != nil || len(role) == 0 {
		c.Close()
		return nil, fmt.Errorf("redsem/sentinel: ROLE on %s: %w", addr, err)
	}
	if r, _ := redis.String(role[0], nil); r != "master" {
		c.Close()
		p.stats.notMaster.Add(1)
		return nil, fmt.Errorf("%w: %s answers ROLE %s", ErrNotMaster, addr, r)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.master != addr {
		c.Close()
		return nil, fmt.Errorf("%w: %s was replaced while dialling", ErrNotMaster, addr)
	}
	for rc := range p.raw {
		if rc.Err() != nil {
			delete(p.raw, rc) // closed by the pool since
		}
	}
	p.raw[c] = addr
	return c, nil
}

// ask asks every sentinel (at once) about the master. It returns the
// address named by the sentinel with the highest config epoch, and whether
// any sentinel runs a failover of it.
func (p *Pool) ask(ctx context.Context) (string, bool, error) {
	type answer struct {
		addr    string
		epoch   int64
		running bool
		err     error
	}
	ch := make(chan answer, len(p.sentinels))
	for _, s := range p.sentinels {
		go func() {
			m, err := p.askOne(ctx, s)
			if err != nil {
				ch <- answer{err: err}
				return
			}
			epoch, _ := strconv.ParseInt(m["config-epoch"], 10, 64)
			ch <- answer{addr: net.JoinHostPort(m["ip"], m["port"]), epoch: epoch, running: hasFlag(m["flags"], "failover_in_progress")}
		}()
	}
	best := answer{epoch: -1}
	var errs []error
	unknown := 0
	for range p.sentinels {
		a := <-ch
		switch {
		case a.err != nil:
			if errors.Is(a.err, ErrUnknownMaster) {
				unknown++
			}
			errs = append(errs, a.err)
		case a.epoch > best.epoch:
			a.running = a.running || best.running
			best = a
		default:
			best.running = best.running || a.running
		}
	}
	if best.addr != "" {
		return best.addr, best.running, nil
	}
	if unknown == len(p.sentinels) {
		return "", false, fmt.Errorf("%w: %q", ErrUnknownMaster, p.name)
	}
	return "", false, errors.Join(errs...)
}

func (p *Pool) askOne(ctx context.Context, addr string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := redis.DialContext(ctx, "tcp", addr, p.sentinelOpts()...)
	if err != nil {
		return nil, fmt.Errorf("sentinel %s: %w", addr, err)
	}
	defer c.Close()
	m, err := redis.StringMap(redis.DoContext(c, ctx, "SENTINEL", "MASTER", p.name))
	if err != nil {
		var re redis.Error
		if errors.As(err, &re) && containsFold(string(re), "no such master") {
			return nil, fmt.Errorf("sentinel %s: %w: %q", addr, ErrUnknownMaster, p.name)
		}
		return nil, fmt.Errorf("sentinel %s: SENTINEL MASTER %s: %w", addr, p.name, err)
	}
	if m["ip"] == "" || m["port"] == "" {
		return nil, fmt.Errorf("sentinel %s: SENTINEL MASTER %s: no address in %v", addr, p.name, m)
	}
	return m, nil
}

func (p *Pool) sentinelOpts() []redis.DialOption {
	return append([]redis.DialOption{redis.DialConnectTimeout(2 * time.Second),
		redis.DialReadTimeout(2 * time.Second), redis.DialWriteTimeout(2 * time.Second)}, p.cfg.sentinelOpts...)
}

// pause sleeps before retry n (0-based): 10ms doubling to 250ms, or until
// the master changes or ctx ends.
func pause(ctx context.Context, n int, changed chan struct{}) error {
	d := min(10*time.Millisecond<<min(n, 5), 250*time.Millisecond)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-changed:
		return nil
	case <-t.C:
		return nil
	}
}

// refused reports whether err holds an authentication or permission
// refusal (NOAUTH, WRONGPASS, NOPERM) from a sentinel or a data node.
func refused(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	word, _, _ := strings.Cut(string(re), " ")
	return word == "NOAUTH" || word == "WRONGPASS" || word == "NOPERM"
}
