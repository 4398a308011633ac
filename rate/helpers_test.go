package rate

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redsem/redsem/internal/redistest"
)

func TestMain(m *testing.M) {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
	if os.Getenv("REDSEM_RATE_HELPER") != "" {
		// A helper process (TestRateGateHelperProcess), ended by SIGTERM
		// while its Waits settle in the background: not a leak check.
		os.Exit(m.Run())
	}
	// The parallel tests mostly wait (on a per, a TTL, a blocked
	// command), each on servers of its own.
	redistest.MoreParallel(8)
	goleak.VerifyTestMain(m)
}

// backend is a Redis a gate test runs against: miniredis in process (mini
// set), or a real redis-server the test starts on a free port.
type backend struct {
	name string
	addr string
	pool *redis.Pool
	mini *miniredis.Miniredis
}

// eachBackend runs f against miniredis and against a real redis-server, in
// parallel subtests.
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, name := range []string{"miniredis", "redis"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := &backend{name: name}
			if name == "miniredis" {
				b.mini = miniredis.RunT(t)
				b.addr = b.mini.Addr()
			} else {
				b.addr = redistest.Start(t).Addr
			}
			b.pool = &redis.Pool{MaxIdle: 64, DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", b.addr)
			}}
			t.Cleanup(func() { b.pool.Close() })
			f(t, b)
		})
	}
}

// do runs one command on a fresh connection (redistest.Do).
func (b *backend) do(t testing.TB, cmd string, args ...interface{}) interface{} {
	t.Helper()
	return redistest.Do(t, b.addr, cmd, args...)
}

// num runs a command whose reply is a number (LLEN, DBSIZE...).
func (b *backend) num(t testing.TB, cmd string, args ...interface{}) int {
	t.Helper()
	n, err := redis.Int(b.do(t, cmd, args...), nil)
	require.NoError(t, err, "%s %v", cmd, args)
	return n
}

// ctxT is a context that ends after d or with the test.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
