package goredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// Pool makes a go-redis client a redsem.Pool. It holds no connections of its
// own: each command borrows one of the client's pooled connections for as
// long as the command (or pipeline) runs. A Pool is safe for concurrent use;
// the connections it hands out are not, as with redigo.
type Pool struct {
	single  *redis.Client        // *redis.Client, including a Sentinel failover client
	cluster *redis.ClusterClient // or a cluster client
	once    sync.Map             // *redis.Client (a node) -> its onceClient
}

// New returns a Pool over client, which must be a *redis.Client (made by
// redis.NewClient or redis.NewFailoverClient) or a *redis.ClusterClient. It
// does no I/O and does not change the client; closing the client is still the
// caller's business.
func New(client redis.UniversalClient) (*Pool, error) {
	switch c := client.(type) {
	case *redis.Client:
		if c != nil {
			return &Pool{single: c}, nil
		}
	case *redis.ClusterClient:
		if c != nil {
			return &Pool{cluster: c}, nil
		}
	case nil:
	default:
		return nil, fmt.Errorf("%w: %T (want *redis.Client or *redis.ClusterClient)", ErrUnsupportedClient, client)
	}
	return nil, fmt.Errorf("%w: nil client", ErrUnsupportedClient)
}

// ErrUnsupportedClient is returned by New for a nil client or a client type
// other than *redis.Client and *redis.ClusterClient (a *redis.Ring, say).
var ErrUnsupportedClient = errors.New("redsem/goredis: unsupported client")

// GetContext returns a connection. It does no I/O: the connection borrows
// one of the client's connections when it is given a command. Close it after
// use, as any redigo connection.
func (p *Pool) GetContext(ctx context.Context) (redigo.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &conn{p: p}, nil
}

// Get is GetContext without a context, for code written against redigo's
// redis.Pool. It never fails.
func (p *Pool) Get() redigo.Conn { return &conn{p: p} }

// node returns the client of the node that serves key: the client itself,
// or the cluster master of key's slot.
func (p *Pool) node(ctx context.Context, key string) (*redis.Client, error) {
	if p.single != nil {
		return p.single, nil
	}
	return p.cluster.MasterForKey(ctx, key)
}

// nodeAt returns the client of the cluster master at addr, for ASK.
func (p *Pool) nodeAt(ctx context.Context, addr string) (*redis.Client, error) {
	if p.single != nil {
		return p.single, nil
	}
	var (
		mu    sync.Mutex
		found *redis.Client
	)
	err := p.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("redsem/goredis: no master at %s", addr)
	}
	return found, nil
}

// reload asks a cluster client to reload its slot map (lazily).
func (p *Pool) reload(ctx context.Context) {
	if p.cluster != nil {
		p.cluster.ReloadState(ctx)
	}
}

// onceClient returns node's client for the adapter's commands: a clone
// (Client.WithTimeout) that shares node's connection pool, options and hooks
// but makes each command one attempt, MaxRetries 0 (read is its read
// timeout). go-redis retries a command whose connection could not be had
// (a failed dial, a pool timeout), each retry a new dial with its own
// retries and log line: with Redis down, one TryAcquire cost seconds and a
// dozen log lines. redsem does its own retrying where it is safe (engine.Call
// on a fresh connection, settling by acquisition id), so one attempt is what
// it wants; a command that was sent is never retried by go-redis anyway on a
// pinned connection.
func onceClient(node *redis.Client, read time.Duration) *redis.Client {
	write := node.Options().WriteTimeout
	c := node.WithTimeout(read)
	o := c.Options() // the clone's own copy
	o.WriteTimeout = write
	o.MaxRetries = 0 // after go-redis's defaults: no retry (-1 before them)
	return c
}

// quiet returns node's onceClient with node's own read timeout, made once.
func (p *Pool) quiet(node *redis.Client) *redis.Client {
	if c, ok := p.once.Load(node); ok {
		return c.(*redis.Client)
	}
	c, _ := p.once.LoadOrStore(node, onceClient(node, node.Options().ReadTimeout))
	return c.(*redis.Client)
}

// unblockFor bounds the attempts to unblock an abandoned blocking command.
const unblockFor = 2 * time.Second
