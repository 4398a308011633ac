package httpgate

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
)

func TestMain(m *testing.M) {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
	code := m.Run()
	// A wait cancelled at a test's end settles in the background for up to
	// the library's settle timeout (5s); a loaded machine stretches it past
	// goleak's own retries. Leaks are what outlive that.
	for deadline := time.Now().Add(15 * time.Second); code == 0 && goleak.Find() != nil && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// replica is one service process: its own pool on the shared Redis, its
// own Limiter, its own HTTP server.
type replica struct {
	lim *Limiter
	srv *httptest.Server
}

// newReplica serves h behind a Limiter of cfg on its own pool of srv.
func newReplica(t *testing.T, srv *redistest.Server, cfg Config, key func(*http.Request) string, h http.Handler) *replica {
	t.Helper()
	lim, err := New(srv.Pool(t), cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(lim.Handler(key, h))
	t.Cleanup(hs.Close)
	return &replica{lim: lim, srv: hs}
}

// get sends a GET to url with ctx and returns the status, the Retry-After
// header and the body; err is the transport's.
func get(ctx context.Context, c *http.Client, url string, header ...string) (int, string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", "", err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body), err
}

// requireFree fails unless all slots of semaphore name on pool are free:
// nothing a refused, cancelled or finished request took is still held.
func requireFree(t *testing.T, pool redsem.Pool, name string, slots int) {
	t.Helper()
	sem, err := redsem.NewSemaphore(pool, name, slots)
	require.NoError(t, err)
	ctx := ctxT(t, 30*time.Second)
	// Polled: a handler's slot goes back just after its response is
	// written, and a cancelled wait settles in the background.
	eventually(t, func() bool {
		var got []*redsem.Lease
		for i := 0; i < slots; i++ {
			l, err := sem.TryAcquire(ctx)
			if err != nil {
				break
			}
			got = append(got, l)
		}
		for _, l := range got {
			_ = l.Release(ctx)
		}
		return len(got) == slots
	}, fmt.Sprintf("%s: a slot is still held", name))
}

// eventually polls cond every 10ms until it holds, failing after a
// generous ceiling.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 10*time.Millisecond, msg)
}

// ctxT is a context that ends after d or with the test.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dbInt runs a command on srv whose reply is a number.
func dbInt(t *testing.T, srv *redistest.Server, cmd string, args ...interface{}) int {
	t.Helper()
	n, err := redis.Int(srv.Do(t, cmd, args...), nil)
	require.NoError(t, err, "%s %v", cmd, args)
	return n
}
