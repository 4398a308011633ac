package admin

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

func TestMain(m *testing.M) {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
	goleak.VerifyTestMain(m)
}

// backend is a Redis a test runs against: miniredis in process (mini set),
// or a real redis-server the test starts on a free port (srv set).
type backend struct {
	name string
	addr string
	pool *redis.Pool
	mini *miniredis.Miniredis
	srv  *redistest.Server
}

// eachBackend runs f against miniredis and against a real redis-server, in
// parallel subtests.
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, name := range []string{"miniredis", "redis"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if name == "miniredis" {
				m := miniredis.RunT(t)
				f(t, &backend{name: name, mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())})
				return
			}
			f(t, realRedis(t))
		})
	}
}

// realRedis starts a real redis-server for tests that need one.
func realRedis(t *testing.T, args ...string) *backend {
	s := redistest.Start(t, args...)
	return &backend{name: "redis", srv: s, addr: s.Addr, pool: s.Pool(t)}
}

func newPool(t testing.TB, addr string) *redis.Pool {
	p := &redis.Pool{MaxIdle: 64, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", addr)
	}}
	t.Cleanup(func() { p.Close() })
	return p
}

// do runs one command on a fresh connection (redistest.Do).
func (b *backend) do(t testing.TB, cmd string, args ...interface{}) interface{} {
	t.Helper()
	return redistest.Do(t, b.addr, cmd, args...)
}

// keyCount counts the keys in the database.
func (b *backend) keyCount(t testing.TB) int {
	n, err := redis.Int(b.do(t, "DBSIZE"), nil)
	require.NoError(t, err)
	return n
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// key is the key of name under prefix that ends in suffix ("leases",
// "tokens", "rw:queue").
func key(prefix, name, suffix string) string { return engine.KeyBase(prefix, name) + suffix }

func newSem(t testing.TB, b *backend, name string, size int, opts ...redsem.Option) *redsem.Semaphore {
	t.Helper()
	s, err := redsem.NewSemaphore(b.pool, name, size, opts...)
	require.NoError(t, err)
	return s
}

func newRateGate(t testing.TB, b *backend, name string, n int, per time.Duration, opts ...rate.Option) *rate.Gate {
	t.Helper()
	g, err := rate.New(b.pool, name, n, per, opts...)
	require.NoError(t, err)
	return g
}

// holdN acquires n leases with acquire, failing the test if any fails.
func holdN(t testing.TB, ctx context.Context, acquire func(context.Context) (*redsem.Lease, error), n int) []*redsem.Lease {
	t.Helper()
	var ls []*redsem.Lease
	for i := 0; i < n; i++ {
		l, err := acquire(ctx)
		require.NoError(t, err)
		ls = append(ls, l)
	}
	return ls
}
