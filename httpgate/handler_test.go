package httpgate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
)

// gauge counts requests in flight and the most seen at once.
type gauge struct{ now, peak, done atomic.Int64 }

func (g *gauge) handler(hold func(r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := g.now.Add(1)
		for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
		}
		hold(r)
		g.now.Add(-1)
		g.done.Add(1)
		_, _ = w.Write([]byte("ok"))
	})
}

func tenant(r *http.Request) string { return r.Header.Get("X-Tenant") }

// TestHandlerCapsAcrossProcesses: three replica processes (this test
// binary, run again as TestReplicaProcess), each with its own Limiter and
// HTTP server, never have more than Slots requests of a key in flight
// between them under 40 concurrent clients: each handler counts itself in
// a Redis counter while it runs and answers the count it saw. Every request
// is served in turn (Wait), and every slot is free afterwards.
func TestHandlerCapsAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	const slots, clients, each = 3, 40, 5
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, startReplica(t, srv.Addr))
	}
	ctx := ctxT(t, 60*time.Second)
	type result struct {
		code int
		seen string
		err  error
	}
	results := make(chan result, clients*each)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				code, _, body, err := get(ctx, http.DefaultClient, urls[(c+i)%len(urls)])
				results <- result{code, body, err}
			}
		}(c)
	}
	wg.Wait()
	close(results)
	peak := 0
	for r := range results {
		require.NoError(t, r.err)
		require.Equal(t, http.StatusOK, r.code, r.seen)
		n, err := strconv.Atoi(r.seen)
		require.NoError(t, err, r.seen)
		peak = max(peak, n)
	}
	assert.LessOrEqual(t, peak, slots, "more requests in flight across the processes than slots")
	assert.Equal(t, clients*each, dbInt(t, srv, "GET", "served"))
	requireFree(t, srv.Pool(t), "api:", slots)
}

const replicaEnv = "HTTPGATE_REPLICA_REDIS"

// startReplica runs TestReplicaProcess in a child process on the Redis at
// addr and returns its server's URL; the child ends with the test.
func startReplica(t *testing.T, addr string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReplicaProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), replicaEnv+"="+addr)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close() // the child's cue to stop
		if err := cmd.Wait(); err != nil {
			t.Errorf("replica process: %v", err)
		}
	})
	out := bufio.NewScanner(stdout)
	for out.Scan() {
		if url, ok := strings.CutPrefix(out.Text(), "URL "); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return url
		}
	}
	t.Fatalf("replica process printed no URL: %v", out.Err())
	return ""
}

// TestReplicaProcess is one replica of TestHandlerCapsAcrossProcesses,
// when run by it; otherwise it does nothing. Its handler counts itself in
// the Redis counter "inflight" while it runs and answers what it saw.
func TestReplicaProcess(t *testing.T) {
	addr := os.Getenv(replicaEnv)
	if addr == "" {
		t.Skip("run by TestHandlerCapsAcrossProcesses")
	}
	pool := &redis.Pool{MaxIdle: 64, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	lim, err := New(pool, Config{Name: "api", Limit: Limit{Slots: 3}, Wait: -1})
	require.NoError(t, err)
	hs := httptest.NewServer(lim.Handler(nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := pool.Get()
		defer c.Close()
		n, err := redis.Int(c.Do("INCR", "inflight"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		time.Sleep(2 * time.Millisecond)
		_, err = c.Do("DECR", "inflight")
		if err == nil {
			_, err = c.Do("INCR", "served")
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, strconv.Itoa(n))
	})))
	defer hs.Close()
	fmt.Println("URL " + hs.URL)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
}

// TestHandlerShedsFullKey: with a key's slot taken, its next request is
// refused at once with FullStatus and Retry-After: 1, while another key is
// served; the slot is given back when the handler returns.
func TestHandlerShedsFullKey(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := Config{Name: "api", Limit: Limit{Slots: 1}, FullStatus: status,
				Limits: func(key string) Limit {
					if key == "big" {
						return Limit{Slots: 2}
					}
					return Limit{}
				}}
			var g gauge
			entered, free := make(chan struct{}, 4), make(chan struct{})
			r := newReplica(t, srv, cfg, tenant, g.handler(func(r *http.Request) {
				if r.URL.Query().Get("hold") != "" {
					entered <- struct{}{}
					<-free
				}
			}))
			ctx := ctxT(t, 30*time.Second)
			held := make(chan int, 3)
			for _, tn := range []string{"a", "big", "big"} {
				go func(tn string) {
					code, _, _, _ := get(ctx, http.DefaultClient, r.srv.URL+"?hold=1", "X-Tenant", tn)
					held <- code
				}(tn)
				<-entered
			}
			code, retry, _, err := get(ctx, http.DefaultClient, r.srv.URL, "X-Tenant", "a")
			require.NoError(t, err)
			assert.Equal(t, status, code, "a's only slot is taken")
			assert.Equal(t, "1", retry)
			code, _, _, err = get(ctx, http.DefaultClient, r.srv.URL, "X-Tenant", "big")
			require.NoError(t, err)
			assert.Equal(t, status, code, "big's two slots are taken")
			code, _, _, err = get(ctx, http.DefaultClient, r.srv.URL, "X-Tenant", "b")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code, "b is another key")
			close(free)
			for i := 0; i < 3; i++ {
				assert.Equal(t, http.StatusOK, <-held)
			}
			code, _, _, err = get(ctx, http.DefaultClient, r.srv.URL, "X-Tenant", "a")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code, "a's slot came back when its handler returned")
			requireFree(t, srv.Pool(t), "api:big", 2)
		})
	}
}

// TestHandlerRateRetryAfter: a key's rate gate refuses a start over its
// rate with 429 and the gate's Retry-After, in whole seconds.
func TestHandlerRateRetryAfter(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{N: 1, Per: time.Minute}}, nil, g.handler(func(*http.Request) {}))
	ctx := ctxT(t, 30*time.Second)
	code, _, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, retry, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, code)
	secs, err := strconv.Atoi(retry)
	require.NoError(t, err, "Retry-After %q", retry)
	assert.True(t, secs > 1 && secs <= 60, "Retry-After %d: the start comes back a minute after the first", secs)
	assert.Equal(t, int64(1), g.done.Load())
}

// TestHandlerWaitDeadline: with Wait set, a request waits for a slot; one
// that gets none within Wait is refused as full, and leaves nothing behind.
func TestHandlerWaitDeadline(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	entered, free := make(chan struct{}, 1), make(chan struct{})
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 1}, Wait: 100 * time.Millisecond}, nil,
		g.handler(func(r *http.Request) {
			if r.URL.Query().Get("hold") != "" {
				entered <- struct{}{}
				<-free
			}
		}))
	ctx := ctxT(t, 30*time.Second)
	held := make(chan int, 1)
	go func() {
		code, _, _, _ := get(ctx, http.DefaultClient, r.srv.URL+"?hold=1")
		held <- code
	}()
	<-entered
	code, retry, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, code, "no slot within Wait")
	assert.Equal(t, "1", retry)

	// A waiter that gets the slot within Wait is served.
	waited := make(chan int, 1)
	hs := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 1}, Wait: 20 * time.Second}, nil, g.handler(func(*http.Request) {}))
	go func() {
		code, _, _, _ := get(ctx, http.DefaultClient, hs.srv.URL)
		waited <- code
	}()
	close(free)
	assert.Equal(t, http.StatusOK, <-held)
	assert.Equal(t, http.StatusOK, <-waited)
	assert.LessOrEqual(t, g.peak.Load(), int64(1))
	requireFree(t, srv.Pool(t), "api:", 1)
}

// TestHandlerClientCancel: a client that gives up while its request waits
// for a slot takes nothing, and its handler never runs.
func TestHandlerClientCancel(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	var sems admin.Counters
	entered, free := make(chan struct{}, 1), make(chan struct{})
	asked := make(chan struct{}, 2)
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 1}, Wait: -1,
		Options: []redsem.Option{redsem.WithObserver(&sems)}},
		func(*http.Request) string { asked <- struct{}{}; return "k" },
		g.handler(func(r *http.Request) {
			if r.URL.Query().Get("hold") != "" {
				entered <- struct{}{}
				<-free
			}
		}))
	ctx := ctxT(t, 30*time.Second)
	held := make(chan int, 1)
	go func() {
		code, _, _, _ := get(ctx, http.DefaultClient, r.srv.URL+"?hold=1")
		held <- code
	}()
	<-asked
	<-entered
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := get(cctx, http.DefaultClient, r.srv.URL)
		errc <- err
	}()
	<-asked
	time.Sleep(50 * time.Millisecond) // let it reach its wait; the test holds either way
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	// The server hears of the client's going from its connection, a
	// moment after the client: the slot frees once its wait has ended.
	eventually(t, func() bool { return sems.Snapshot().Cancellations == 1 }, "the server ends the cancelled wait")
	close(free)
	assert.Equal(t, http.StatusOK, <-held)
	requireFree(t, srv.Pool(t), "api:k", 1)
	assert.Equal(t, int64(1), g.done.Load(), "the cancelled request's handler never ran")
}

// TestHandlerRedisDown: with Redis unreachable a request is refused with
// 503 (fail closed, the default), without waiting out Wait, or served
// unlimited with FailOpen.
func TestHandlerRedisDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"closed", Config{Limit: Limit{Slots: 1}}, http.StatusServiceUnavailable},
		{"closed waiting", Config{Limit: Limit{Slots: 1}, Wait: time.Hour}, http.StatusServiceUnavailable},
		{"closed rate", Config{Limit: Limit{N: 5, Per: time.Second}, Wait: time.Hour}, http.StatusServiceUnavailable},
		{"open", Config{Limit: Limit{Slots: 1, N: 5, Per: time.Second}, FailOpen: true}, http.StatusOK},
		{"open waiting", Config{Limit: Limit{Slots: 1}, Wait: time.Hour, FailOpen: true}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			var g gauge
			tc.cfg.Name = "api"
			r := newReplica(t, srv, tc.cfg, nil, g.handler(func(*http.Request) {}))
			srv.Kill()
			code, retry, _, err := get(ctxT(t, 30*time.Second), http.DefaultClient, r.srv.URL)
			require.NoError(t, err)
			assert.Equal(t, tc.want, code)
			if code == http.StatusServiceUnavailable {
				assert.Equal(t, "1", retry, "Retry-After: DownRetryAfter")
			}
			want := int64(0)
			if tc.want == http.StatusOK {
				want = 1
			}
			assert.Equal(t, want, g.done.Load(), "handler runs")
		})
	}
}

// TestHandlerRedisDownWhileWaiting: a request already waiting for a slot
// when Redis goes away takes the Redis-down path, whatever Wait says: 503,
// or served with FailOpen; it neither waits out Wait nor hangs.
func TestHandlerRedisDownWhileWaiting(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"closed", Config{Limit: Limit{Slots: 1}, Wait: time.Hour}, http.StatusServiceUnavailable},
		{"closed unbounded", Config{Limit: Limit{Slots: 1}, Wait: -1}, http.StatusServiceUnavailable},
		{"open", Config{Limit: Limit{Slots: 1}, Wait: time.Hour, FailOpen: true}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			var g gauge
			entered, free := make(chan struct{}, 1), make(chan struct{})
			tc.cfg.Name = "api"
			r := newReplica(t, srv, tc.cfg, nil, g.handler(func(r *http.Request) {
				if r.URL.Query().Get("hold") != "" {
					entered <- struct{}{}
					<-free
				}
			}))
			ctx := ctxT(t, 30*time.Second)
			held := make(chan int, 1)
			go func() {
				code, _, _, _ := get(ctx, http.DefaultClient, r.srv.URL+"?hold=1")
				held <- code
			}()
			<-entered
			waited := make(chan int, 1)
			go func() {
				code, _, _, _ := get(ctx, http.DefaultClient, r.srv.URL)
				waited <- code // 0: the client gave up first
			}()
			eventually(t, func() bool {
				info, _ := redis.String(srv.Do(t, "INFO", "clients"), nil)
				return !strings.Contains(info, "blocked_clients:0")
			}, "the second request waits in Redis")
			srv.Kill()
			assert.Equal(t, tc.want, <-waited)
			close(free)
			assert.Equal(t, http.StatusOK, <-held)
		})
	}
}

// TestHandlerRedisSilent: a Redis that accepts connections but never
// replies (here a stopped redis-server), behind a pool without timeouts,
// takes the Redis-down path in the default mode too (Wait 0, shed at
// once): 503, or served with FailOpen; the request neither hangs nor waits
// for its client to give up.
func TestHandlerRedisSilent(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"closed", Config{Limit: Limit{Slots: 1}}, http.StatusServiceUnavailable},
		{"closed rate", Config{Limit: Limit{N: 5, Per: time.Second}}, http.StatusServiceUnavailable},
		{"closed waiting", Config{Limit: Limit{Slots: 1}, Wait: time.Hour}, http.StatusServiceUnavailable},
		{"open", Config{Limit: Limit{Slots: 1, N: 5, Per: time.Second}, FailOpen: true}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			var g gauge
			tc.cfg.Name = "api"
			r := newReplica(t, srv, tc.cfg, nil, g.handler(func(*http.Request) {}))
			require.NoError(t, srv.Signal(syscall.SIGSTOP))
			t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
			code, retry, _, err := get(ctxT(t, 30*time.Second), http.DefaultClient, r.srv.URL)
			require.NoError(t, err, "the request comes back before its client gives up")
			assert.Equal(t, tc.want, code)
			if code == http.StatusServiceUnavailable {
				assert.Equal(t, "1", retry, "Retry-After: DownRetryAfter")
			}
			want := int64(0)
			if tc.want == http.StatusOK {
				want = 1
			}
			assert.Equal(t, want, g.done.Load(), "handler runs")
		})
	}
}

// TestHandlerRateWaitRetryAfter: a request that gets no start within Wait
// is told the gate's figure, not a second.
func TestHandlerRateWaitRetryAfter(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{N: 1, Per: time.Minute}, Wait: 100 * time.Millisecond},
		nil, g.handler(func(*http.Request) {}))
	ctx := ctxT(t, 30*time.Second)
	code, _, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, retry, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, code)
	secs, err := strconv.Atoi(retry)
	require.NoError(t, err, "Retry-After %q", retry)
	assert.True(t, secs > 1 && secs <= 60, "Retry-After %d: the start comes back a minute after the first", secs)
	assert.Equal(t, int64(1), g.done.Load())
}

// TestHandlerLostLease: a long request keeps its slot by auto-refresh past
// many TTLs, and when its lease is lost (here its keys are deleted) the
// request's context is cancelled with the cause.
func TestHandlerLostLease(t *testing.T) {
	srv := redistest.Start(t)
	// A TTL of a second: a loaded machine that stalls a refresh for a tenth
	// of a second must not let the lease expire.
	const ttl = time.Second
	cause := make(chan error, 1)
	entered := make(chan struct{}, 1)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 1}, Options: []redsem.Option{redsem.WithTTL(ttl)}}, nil,
		g.handler(func(r *http.Request) {
			if r.URL.Query().Get("hold") == "" {
				return
			}
			entered <- struct{}{}
			<-r.Context().Done()
			cause <- context.Cause(r.Context())
		}))
	ctx := ctxT(t, 30*time.Second)
	held := make(chan int, 1)
	go func() {
		code, _, _, _ := get(ctx, http.DefaultClient, r.srv.URL+"?hold=1")
		held <- code
	}()
	<-entered
	time.Sleep(3 * ttl) // several TTLs: only refreshes keep the slot
	code, _, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, code, "the long request still holds the slot")
	srv.Do(t, "FLUSHALL")
	assert.True(t, errors.Is(<-cause, redsem.ErrLeaseLost), "the request's context ends when its lease is lost")
	assert.Equal(t, http.StatusOK, <-held)
}

// TestAcquireWaitRunsOut: a wait that runs out is a full limit, whatever
// ends it first, its deadline's timer or a read with that deadline: a
// *FullError (429 and Retry-After) every time, never an error of a Redis
// that fails (503). Short waits, many times, meet both orders.
func TestAcquireWaitRunsOut(t *testing.T) {
	srv := redistest.Start(t)
	lim, err := New(srv.Pool(t), Config{Name: "api", Limit: Limit{N: 1, Per: time.Minute}, Wait: time.Millisecond})
	require.NoError(t, err)
	ctx := ctxT(t, 30*time.Second)
	_, err = lim.Acquire(ctx, "")
	require.NoError(t, err)
	for i := 0; i < 200; i++ {
		_, err = lim.Acquire(ctx, "")
		var full *FullError
		require.ErrorAs(t, err, &full, "try %d: %v", i, err)
	}
}
