package redsem

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// BenchmarkSemaphore_AcquireN_redisTime measures the time Redis spends in the scripts
// of one AcquireN(k) on a semaphore of size k, on a real redis-server: the
// figure that shows whether collecting grows with k or with k².
//
//	go test -run '^$' -bench Semaphore_AcquireN_redisTime -benchtime 3x .
//
// free: all k tokens are free when AcquireN starts. one-by-one: k single
// leases hold every token; the collector queues, then they are released one
// at a time, each going to the collector.
//
// SLOWLOG (threshold 0) times every command, so each script's own time is
// told apart by its SHA: acquire_n-us/op and acquire_n-calls/op are the
// total Redis time and the runs of acquire_n.lua for one acquisition,
// acquire_n-max-us the longest single run and acquire_n-p50-us the median
// one (over every run of every iteration); release-us/op is the time of the
// k releases (release.lua routes each to the collector), release-max-us
// the longest. evalsha-us/op is INFO commandstats' EVALSHA time for the
// same span, every script together.
func BenchmarkSemaphore_AcquireN_redisTime(b *testing.B) {
	for _, k := range []int{2000} {
		b.Run(fmt.Sprintf("free/k=%d", k), func(b *testing.B) { benchAcquireNRedisTime(b, k, false) })
		b.Run(fmt.Sprintf("one-by-one/k=%d", k), func(b *testing.B) { benchAcquireNRedisTime(b, k, true) })
		b.Run(fmt.Sprintf("try/k=%d", k), func(b *testing.B) { benchTryAcquireNRedisTime(b, k) })
	}
}

// slowlogSemaphore starts a redis-server that logs every command in
// SLOWLOG and returns a semaphore of size k named name on it, and an admin
// connection.
func slowlogSemaphore(b *testing.B, name string, k int) (*Semaphore, redis.Conn) {
	srv := redistest.Start(b, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "1000000")
	s, err := NewSemaphore(newPool(b, srv.Addr), name, k, WithFixedTTL(), WithTTL(10*time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	admin, err := redis.Dial("tcp", srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { admin.Close() })
	return s, admin
}

func benchAcquireNRedisTime(b *testing.B, k int, oneByOne bool) {
	s, admin := slowlogSemaphore(b, "redistime-n", k)
	ctx := context.Background()
	// Load the scripts and create the semaphore.
	l, err := s.AcquireN(ctx, k)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		b.Fatal(err)
	}
	var acqUs, acqMax, acqCalls, relUs, relMax, refUs, refMax, evalUs float64
	var acqRuns []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		var holders []*Lease
		if oneByOne {
			holders = holdN(b, ctx, s.Acquire, k)
		}
		if _, err := admin.Do("CONFIG", "RESETSTAT"); err != nil {
			b.Fatal(err)
		}
		mark, err := resetSlowlog(admin)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		got := make(chan error, 1)
		go func() {
			l, err := s.AcquireN(ctx, k)
			if err == nil && !oneByOne {
				err = l.Refresh(ctx, 10*time.Minute)
			}
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		if oneByOne {
			// The collector queues first (its BLMOVE registered), then the
			// holders release one at a time.
			for blocked(b, admin) == 0 {
				time.Sleep(time.Millisecond)
			}
			for _, h := range holders {
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := <-got; err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		log, err := readSlowlog(admin, mark)
		if err != nil {
			b.Fatal(err)
		}
		if log.lost > 0 {
			b.Logf("SLOWLOG lost its %d oldest entries: the figures are lower bounds", log.lost)
		}
		a, r := log.by[engine.AcquireN.Hash()], log.by[engine.Release.Hash()]
		acqUs, acqCalls, relUs = acqUs+a.usec, acqCalls+a.calls, relUs+r.usec
		acqMax, relMax = max(acqMax, a.max), max(relMax, r.max)
		f := log.by[engine.Refresh.Hash()]
		refUs, refMax = refUs+f.usec, max(refMax, f.max)
		acqRuns = append(acqRuns, a.runs...)
		info, err := redis.String(admin.Do("INFO", "commandstats"))
		if err != nil {
			b.Fatal(err)
		}
		_, usec := commandStat(info, "evalsha")
		evalUs += usec
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(acqUs/n, "acquire_n-us/op")
	b.ReportMetric(acqMax, "acquire_n-max-us")
	sort.Float64s(acqRuns)
	if len(acqRuns) > 0 {
		b.ReportMetric(acqRuns[len(acqRuns)/2], "acquire_n-p50-us")
	}
	b.ReportMetric(acqCalls/n, "acquire_n-calls/op")
	b.ReportMetric(relUs/n, "release-us/op")
	b.ReportMetric(relMax, "release-max-us")
	if !oneByOne {
		b.ReportMetric(refUs/n, "refresh-us/op")
		b.ReportMetric(refMax, "refresh-max-us")
	}
	b.ReportMetric(evalUs/n, "evalsha-us/op")
}

// benchTryAcquireNRedisTime measures one TryAcquireN(k) of a free
// semaphore of size k, then its release: acquire_n-max-us is the longest
// single run of acquire_n.lua, acquire_n-calls/op how many runs it took.
func benchTryAcquireNRedisTime(b *testing.B, k int) {
	s, admin := slowlogSemaphore(b, "redistime-try", k)
	ctx := context.Background()
	var acqUs, acqMax, acqCalls, relUs, relMax float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		mark, err := resetSlowlog(admin)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		l, err := s.TryAcquireN(ctx, k)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		log, err := readSlowlog(admin, mark)
		if err != nil {
			b.Fatal(err)
		}
		a, r := log.by[engine.AcquireN.Hash()], log.by[engine.Release.Hash()]
		acqUs, acqCalls, relUs = acqUs+a.usec, acqCalls+a.calls, relUs+r.usec
		acqMax, relMax = max(acqMax, a.max), max(relMax, r.max)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(acqUs/n, "acquire_n-us/op")
	b.ReportMetric(acqMax, "acquire_n-max-us")
	b.ReportMetric(acqCalls/n, "acquire_n-calls/op")
	b.ReportMetric(relUs/n, "release-us/op")
	b.ReportMetric(relMax, "release-max-us")
}

// blocked returns INFO clients' blocked_clients.
func blocked(b *testing.B, admin redis.Conn) int {
	info, err := redis.String(admin.Do("INFO", "clients"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// slowlogStat is what SLOWLOG holds of one script: runs, total and longest
// µs.
type slowlogStat struct {
	calls, usec, max float64
	runs             []float64 // each run's µs
}

// slowlog sums the runs of each script in the server's SLOWLOG by SHA
// (threshold 0: every command is logged, the commands scripts run
// included). lost counts the entries that fell off the end of the log
// (slowlog-max-len): then the sums are lower bounds.
type slowlog struct {
	by   map[string]slowlogStat
	lost int64
}

// resetSlowlog empties the SLOWLOG and returns the id its first entry will
// have (the RESET itself: ids go on across resets).
func resetSlowlog(c redis.Conn) (int64, error) {
	last, err := slowlogIDs(c, 1)
	if err != nil {
		return 0, err
	}
	// The GET just made was logged with the next id, then RESET is.
	_, err = c.Do("SLOWLOG", "RESET")
	return last + 2, err
}

// slowlogIDs returns the id of the newest of the n newest entries.
func slowlogIDs(c redis.Conn, n int) (int64, error) {
	entries, err := redis.Values(c.Do("SLOWLOG", "GET", n))
	if err != nil || len(entries) == 0 {
		return -1, err
	}
	e, err := redis.Values(entries[0], nil)
	if err != nil || len(e) == 0 {
		return -1, fmt.Errorf("SLOWLOG entry %v: %v", entries[0], err)
	}
	return redis.Int64(e[0], nil)
}

// readSlowlog reads the whole SLOWLOG, whose first entry was to have id
// first (resetSlowlog).
func readSlowlog(c redis.Conn, first int64) (slowlog, error) {
	l := slowlog{by: map[string]slowlogStat{}}
	entries, err := redis.Values(c.Do("SLOWLOG", "GET", -1))
	if err != nil {
		return l, err
	}
	if len(entries) > 0 {
		newest, err := redis.Values(entries[0], nil)
		if err != nil {
			return l, err
		}
		id, _ := redis.Int64(newest[0], nil)
		l.lost = id - first + 1 - int64(len(entries))
	}
	for _, e := range entries {
		fields, err := redis.Values(e, nil)
		if err != nil || len(fields) < 4 {
			return l, fmt.Errorf("SLOWLOG entry %v: %v", e, err)
		}
		us, _ := redis.Int64(fields[2], nil)
		args, _ := redis.Strings(fields[3], nil)
		if len(args) < 2 || !strings.EqualFold(args[0], "evalsha") {
			continue
		}
		st := l.by[args[1]]
		st.calls++
		st.usec += float64(us)
		st.max = max(st.max, float64(us))
		st.runs = append(st.runs, float64(us))
		l.by[args[1]] = st
	}
	return l, nil
}
