package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/errconn"
)

// Pool is a connection source for a Redis Cluster. It keeps the slot map
// (from CLUSTER SLOTS) and one redigo pool per master, and hands out routing
// connections: each sends a command to the master of the command's key and
// follows MOVED, ASK and TRYAGAIN. It satisfies redsem.Pool, so a Semaphore
// or Mutex built on it works unchanged. A Pool is safe for concurrent use;
// connections are not, as with redigo.
type Pool struct {
	cfg   config
	seeds []string

	mu      sync.RWMutex
	slots   [SlotCount]string // master address per slot, "" when unknown
	masters []string
	nodes   map[string]*redis.Pool
	closed  bool

	refreshMu   sync.Mutex // one refresh at a time
	lastRefresh time.Time
	refreshing  atomic.Bool
	bg          sync.WaitGroup

	rr    atomic.Uint64
	stats struct {
		moved, ask, retries, refreshes, connErrors atomic.Int64
	}
}

// New connects to the cluster through any of addrs (host:port of any nodes,
// masters or replicas), loads the slot map and returns a Pool. It fails when
// none of addrs answers CLUSTER SLOTS or an option is invalid.
func New(ctx context.Context, addrs []string, opts ...Option) (*Pool, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("redsem/cluster: no addresses")
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, seeds: append([]string(nil), addrs...), nodes: map[string]*redis.Pool{}}
	if err := p.refresh(ctx, true); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// GetContext returns a routing connection. It does no I/O: the connection
// picks a node when it is given its first command. Close it after use, as
// with any redigo connection; it then gives its node connection back to that
// node's pool.
func (p *Pool) GetContext(ctx context.Context) (redis.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.RLock()
	closed := p.closed
	p.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	c := &conn{p: p}
	if p.cfg.waitReplicas > 0 {
		return newWaitConn(c, p.cfg.waitReplicas, p.cfg.waitTimeout), nil
	}
	return c, nil
}

// Get is GetContext without a context, for code written against
// redis.Pool. Errors are reported by the connection's methods.
func (p *Pool) Get() redis.Conn {
	c, err := p.GetContext(context.Background())
	if err != nil {
		return errconn.New(err)
	}
	return c
}

// Masters returns the addresses of the masters in the current slot map.
func (p *Pool) Masters() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]string(nil), p.masters...)
}

// MasterOf returns the address of the master that serves key's slot in the
// current slot map, or "" when the map has none.
func (p *Pool) MasterOf(key string) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.slots[Slot(key)]
}

// Stats counts what the Pool has done since New.
type Stats struct {
	Moved      int64 // MOVED replies followed (or reported, in pipelines)
	Ask        int64 // ASK replies followed
	Retries    int64 // retries after TRYAGAIN, CLUSTERDOWN, LOADING, failed dials
	Refreshes  int64 // slot map loads
	ConnErrors int64 // connection failures seen
}

// Stats returns the Pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{
		Moved: p.stats.moved.Load(), Ask: p.stats.ask.Load(), Retries: p.stats.retries.Load(),
		Refreshes: p.stats.refreshes.Load(), ConnErrors: p.stats.connErrors.Load(),
	}
}

// Refresh reloads the slot map now.
func (p *Pool) Refresh(ctx context.Context) error { return p.refresh(ctx, true) }

// Close closes every node pool. Connections in use are closed when they are
// closed by their users; new ones fail with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	nodes := p.nodes
	p.nodes = map[string]*redis.Pool{}
	p.mu.Unlock()
	p.bg.Wait()
	for _, np := range nodes {
		np.Close()
	}
	return nil
}

// route returns the master of slot, or for slot -1 (a keyless command) any
// master.
func (p *Pool) route(slot int) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if slot >= 0 {
		return p.slots[slot]
	}
	if len(p.masters) == 0 {
		return ""
	}
	return p.masters[p.rr.Add(1)%uint64(len(p.masters))]
}

// nodePool returns the redigo pool of addr, creating it on first use.
func (p *Pool) nodePool(addr string) (*redis.Pool, error) {
	p.mu.RLock()
	np, closed := p.nodes[addr], p.closed
	p.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if np != nil {
		return np, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if np = p.nodes[addr]; np == nil {
		np = p.newNodePool(addr)
		p.nodes[addr] = np
	}
	return np, nil
}

func (p *Pool) newNodePool(addr string) *redis.Pool {
	if p.cfg.newPool != nil {
		return p.cfg.newPool(addr)
	}
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

func (p *Pool) dial(ctx context.Context, addr string) (redis.Conn, error) {
	opts := append([]redis.DialOption{redis.DialConnectTimeout(5 * time.Second)}, p.cfg.dialOpts...)
	return redis.DialContext(ctx, "tcp", addr, opts...)
}

// nodeFailed is called after a connection to addr failed: its idle
// connections are likely dead too (the node crashed or restarted), so its
// pool is dropped, and the slot map is reloaded.
func (p *Pool) nodeFailed(addr string) {
	p.stats.connErrors.Add(1)
	p.mu.Lock()
	np := p.nodes[addr]
	delete(p.nodes, addr)
	p.mu.Unlock()
	if np != nil {
		np.Close()
	}
	p.refreshAsync()
}

// moved records a MOVED redirection in the map at once and reloads the map
// in the background (a MOVED usually means more than one slot moved).
func (p *Pool) moved(slot int, addr string) {
	p.stats.moved.Add(1)
	p.mu.Lock()
	if !p.closed {
		p.slots[slot] = addr
	}
	p.mu.Unlock()
	p.refreshAsync()
}

// refreshAsync reloads the slot map in the background unless a reload is
// already running or one finished in the last minRefreshGap.
func (p *Pool) refreshAsync() {
	if !p.refreshing.CompareAndSwap(false, true) {
		return
	}
	p.mu.RLock()
	closed := p.closed
	if !closed {
		p.bg.Add(1)
	}
	p.mu.RUnlock()
	if closed {
		p.refreshing.Store(false)
		return
	}
	go func() {
		defer p.bg.Done()
		defer p.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.refresh(ctx, false)
	}()
}

const minRefreshGap = 100 * time.Millisecond

// refresh loads the slot map from the first node that answers: the known
// masters first, then the seeds, each list in random order.
func (p *Pool) refresh(ctx context.Context, force bool) error {
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	if !force && time.Since(p.lastRefresh) < minRefreshGap {
		return nil
	}
	cands := p.Masters()
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	seeds := append([]string(nil), p.seeds...)
	rand.Shuffle(len(seeds), func(i, j int) { seeds[i], seeds[j] = seeds[j], seeds[i] })
	var lastErr error = ErrNoNode
	for _, addr := range append(cands, seeds...) {
		if ctx.Err() != nil {
			break
		}
		slots, masters, err := p.loadSlots(ctx, addr)
		if err != nil {
			lastErr = err
			continue
		}
		p.stats.refreshes.Add(1)
		p.lastRefresh = time.Now()
		p.install(slots, masters)
		return nil
	}
	return fmt.Errorf("%w: %v", ErrNoNode, lastErr)
}

// install swaps in a new slot map and closes the pools of nodes that are no
// longer masters (their connections in use close when given back).
func (p *Pool) install(slots *[SlotCount]string, masters []string) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.slots = *slots
	p.masters = masters
	keep := map[string]bool{}
	for _, m := range masters {
		keep[m] = true
	}
	var drop []*redis.Pool
	for addr, np := range p.nodes {
		if !keep[addr] {
			drop = append(drop, np)
			delete(p.nodes, addr)
		}
	}
	p.mu.Unlock()
	for _, np := range drop {
		np.Close()
	}
}

// loadSlots asks addr for CLUSTER SLOTS on a connection of its own.
func (p *Pool) loadSlots(ctx context.Context, addr string) (*[SlotCount]string, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := p.dial(ctx, addr)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	reply, err := redis.Values(redis.DoContext(c, ctx, "CLUSTER", "SLOTS"))
	if err != nil {
		return nil, nil, fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, err)
	}
	askedHost, _, _ := net.SplitHostPort(addr)
	var slots [SlotCount]string
	seen := map[string]bool{}
	var masters []string
	for _, r := range reply {
		f, err := redis.Values(r, nil)
		if err != nil || len(f) < 3 {
			return nil, nil, fmt.Errorf("CLUSTER SLOTS on %s: bad entry %v", addr, r)
		}
		lo, err1 := redis.Int(f[0], nil)
		hi, err2 := redis.Int(f[1], nil)
		node, err3 := redis.Values(f[2], nil)
		if err1 != nil || err2 != nil || err3 != nil || len(node) < 2 || lo < 0 || hi >= SlotCount || lo > hi {
			return nil, nil, fmt.Errorf("CLUSTER SLOTS on %s: bad entry %v", addr, r)
		}
		host, _ := redis.String(node[0], nil)
		port, err := redis.Int(node[1], nil)
		if err != nil {
			return nil, nil, fmt.Errorf("CLUSTER SLOTS on %s: bad port in %v", addr, r)
		}
		if host == "" || host == "?" {
			host = askedHost
		}
		m := net.JoinHostPort(host, strconv.Itoa(port))
		for s := lo; s <= hi; s++ {
			slots[s] = m
		}
		if !seen[m] {
			seen[m] = true
			masters = append(masters, m)
		}
	}
	if len(masters) == 0 {
		return nil, nil, fmt.Errorf("CLUSTER SLOTS on %s: no slots assigned", addr)
	}
	return &slots, masters, nil
}

// backoff sleeps before retry attempt n (0-based): 10ms doubling to 500ms,
// or until ctx ends.
func backoff(ctx context.Context, n int) error {
	d := 10 * time.Millisecond << min(n, 6)
	if d > 500*time.Millisecond {
		d = 500 * time.Millisecond
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
