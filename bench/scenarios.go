package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// metrics are one run's figures, by name.
type metrics map[string]float64

// uncontended: one goroutine acquires and releases a mutex n times, for
// every library. The libraries take turns in rounds of n/10 pairs, so that
// the machine's changing load falls on all of them alike.
func (e *env) uncontended(ls []*lib, n int) (map[string]metrics, error) {
	type state struct {
		lk                    locker
		c                     counters
		lat                   []float64
		rtAcq, rtRel, rt, cmd int64
		calls, scripts, susec int64
		serverUs              float64
		elapsed               time.Duration
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := make([]*state, len(ls))
	for i, l := range ls {
		s := &state{}
		st[i] = s
		cl, err := l.newClient(e.addr, &s.c, false)
		if err != nil {
			return nil, err
		}
		defer cl.close()
		key := e.key(l.name, "uncontended")
		if err := e.prepare(l, key, 1); err != nil {
			return nil, err
		}
		if s.lk, err = cl.locker(key, 1); err != nil {
			return nil, err
		}
		for range 20 { // dial, create the lock, load scripts
			rel, err := s.lk.lock(ctx)
			if err != nil {
				return nil, err
			}
			if err := rel(ctx); err != nil {
				return nil, err
			}
		}
	}
	const rounds = 10
	for r := range rounds {
		for k := range ls {
			i := (k + r) % len(ls)
			s := st[i]
			rt0, cmd0 := s.c.snapshot()
			sent0 := s.c.sentByName()
			s0 := e.stats()
			start := time.Now()
			for range n / rounds {
				t := time.Now()
				a0, _ := s.c.snapshot()
				rel, err := s.lk.lock(ctx)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", ls[i].name, err)
				}
				a1, _ := s.c.snapshot()
				if err := rel(ctx); err != nil {
					return nil, fmt.Errorf("%s: %w", ls[i].name, err)
				}
				s.lat = append(s.lat, us(time.Since(t)))
				a2, _ := s.c.snapshot()
				s.rtAcq += a1 - a0
				s.rtRel += a2 - a1
			}
			s.elapsed += time.Since(start)
			s1 := e.stats()
			rt1, cmd1 := s.c.snapshot()
			s.rt += rt1 - rt0
			s.cmd += cmd1 - cmd0
			s.calls += s1.calls - s0.calls
			s.scripts += s1.scripts - s0.scripts
			s.susec += s1.scriptUsec - s0.scriptUsec
			sent := s.c.sentByName()
			for k, v := range sent0 {
				sent[k] -= v
			}
			s.serverUs += serverUsec(s0, s1, sent)
		}
	}
	out := map[string]metrics{}
	for i, s := range st {
		fn := float64(len(s.lat))
		out[ls[i].name] = metrics{
			"pairs_per_s":      fn / s.elapsed.Seconds(),
			"p50_us":           percentile(s.lat, 0.5),
			"p99_us":           percentile(s.lat, 0.99),
			"redis_cmds":       float64(s.calls) / fn,
			"sent_cmds":        float64(s.cmd) / fn,
			"scripts":          float64(s.scripts) / fn,
			"roundtrips":       float64(s.rt) / fn,
			"roundtrips_acq":   float64(s.rtAcq) / fn,
			"roundtrips_rel":   float64(s.rtRel) / fn,
			"script_inner_cmd": float64(s.calls-s.cmd) / fn,
			"script_us":        float64(s.susec) / fn,
			"server_us":        s.serverUs / fn,
		}
	}
	return out, nil
}

// contended: workers goroutines, each with its own client (connection),
// take a lock of size tokens in a loop, hold it for hold, and release it. The
// first dur/5 is a warm-up (every worker's first wait starts at once);
// only acquisitions that complete within the next dur count, and Redis and
// client counters are read at the window's edges.
func (e *env) contended(l *lib, size, workers int, hold, dur time.Duration) (metrics, error) {
	c := &counters{}
	key := e.key(l.name, fmt.Sprintf("contended-%d-%d", size, workers))
	if err := e.prepare(l, key, size); err != nil {
		return nil, err
	}
	bg, cancelBg := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancelBg()
	lockers := make([]locker, workers)
	for i := range workers {
		cl, err := l.newClient(e.addr, c, false)
		if err != nil {
			return nil, err
		}
		defer cl.close()
		if err := cl.warm(bg); err != nil {
			return nil, err
		}
		if lockers[i], err = cl.locker(key, size); err != nil {
			return nil, err
		}
	}
	// Create the lock and load scripts before the clock starts.
	rel, err := lockers[0].lock(bg)
	if err != nil {
		return nil, err
	}
	if err := rel(bg); err != nil {
		return nil, err
	}

	type worker struct {
		acqs     int
		waits    []float64
		censored float64 // wait still unserved at the deadline, µs
		busy     time.Duration
		err      error
	}
	res := make([]worker, workers)
	var holders, maxHolders atomic.Int64
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	startCh := make(chan struct{})
	var from, deadline time.Time
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func(w *worker, lk locker) {
			defer wg.Done()
			<-startCh
			for {
				t := time.Now()
				if !t.Before(deadline) {
					return
				}
				rel, err := lk.lock(ctx)
				got := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						w.err = err
					}
					w.censored = us(deadline.Sub(t))
					return
				}
				h := holders.Add(1)
				for m := maxHolders.Load(); h > m && !maxHolders.CompareAndSwap(m, h); m = maxHolders.Load() {
				}
				in := got.Before(deadline)
				counted := in && !got.Before(from)
				if counted {
					w.acqs++
					w.waits = append(w.waits, us(got.Sub(t)))
				} else if !in {
					w.censored = us(deadline.Sub(t))
				}
				if hold > 0 {
					time.Sleep(hold)
				}
				end := time.Now()
				holders.Add(-1)
				if counted {
					if end.After(deadline) {
						end = deadline
					}
					w.busy += end.Sub(got)
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = rel(rctx)
				rcancel()
				if err != nil {
					w.err = fmt.Errorf("release: %w", err)
					return
				}
				if !in {
					return
				}
			}
		}(&res[i], lockers[i])
	}
	from = time.Now().Add(dur / 5)
	deadline = from.Add(dur)
	close(startCh)
	time.Sleep(time.Until(from))
	rt0, cmd0 := c.snapshot()
	s0 := e.stats()
	time.Sleep(time.Until(deadline))
	s1 := e.stats()
	rt1, cmd1 := c.snapshot()
	cancel()
	wg.Wait()

	var waits, per []float64
	var total, starved int
	var busy time.Duration
	maxWait := 0.0
	for _, w := range res {
		if w.err != nil {
			return nil, w.err
		}
		total += w.acqs
		per = append(per, float64(w.acqs))
		if w.acqs == 0 {
			starved++
		}
		waits = append(waits, w.waits...)
		busy += w.busy
		maxWait = math.Max(maxWait, math.Max(w.censored, maxOf(append([]float64{0}, w.waits...))))
	}
	ft := float64(max(total, 1))
	return metrics{
		"acq_per_s":   float64(total) / dur.Seconds(),
		"wait_p50_us": percentile(waits, 0.5),
		"wait_p99_us": percentile(waits, 0.99),
		"wait_max_us": maxWait,
		"jain":        jain(per),
		"starved":     float64(starved),
		"redis_cmds":  float64(s1.calls-s0.calls) / ft,
		"sent_cmds":   float64(cmd1-cmd0) / ft,
		"roundtrips":  float64(rt1-rt0) / ft,
		"max_holders": float64(maxHolders.Load()),
		"utilisation": busy.Seconds() / (float64(size) * dur.Seconds()),
	}, nil
}

// handoff: a waiter is blocked, the holder releases at t0; the sample is the
// time until the waiter holds the lock. Returns the samples in µs.
func (e *env) handoff(l *lib, trials int) ([]float64, error) {
	pairs := max(1, l.parallel)
	per := (trials + pairs - 1) / pairs
	samples := make([][]float64, pairs)
	errs := make([]error, pairs)
	var wg sync.WaitGroup
	for p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			samples[p], errs[p] = e.handoffPair(l, per, pairs == 1)
		}()
	}
	wg.Wait()
	var all []float64
	for p := range pairs {
		if errs[p] != nil {
			return nil, errs[p]
		}
		all = append(all, samples[p]...)
	}
	return all, nil
}

func (e *env) handoffPair(l *lib, trials int, alone bool) ([]float64, error) {
	c := &counters{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := e.key(l.name, "handoff")
	if err := e.prepare(l, key, 1); err != nil {
		return nil, err
	}
	var lks [2]locker
	for i := range lks {
		cl, err := l.newClient(e.addr, c, false)
		if err != nil {
			return nil, err
		}
		defer cl.close()
		if err := cl.warm(ctx); err != nil {
			return nil, err
		}
		if lks[i], err = cl.locker(key, 1); err != nil {
			return nil, err
		}
	}
	holder, waiter := lks[0], lks[1]
	type got struct {
		at  time.Time
		rel func(context.Context) error
		err error
	}
	out := make([]float64, 0, trials)
	for range trials + 1 { // the first trial warms up the waiter
		rel, err := holder.lock(ctx)
		if err != nil {
			return nil, err
		}
		ch := make(chan got, 1)
		go func() {
			r, err := waiter.lock(ctx)
			ch <- got{time.Now(), r, err}
		}()
		if l.blocking && alone && !e.waitBlocked(1, 5*time.Second) {
			return nil, fmt.Errorf("%s: waiter never blocked", l.name)
		}
		time.Sleep(l.settle + time.Duration(rand.Int64N(int64(l.jitter)+1)))
		t0 := time.Now()
		if err := rel(ctx); err != nil {
			return nil, err
		}
		g := <-ch
		if g.err != nil {
			return nil, g.err
		}
		out = append(out, us(g.at.Sub(t0)))
		if err := g.rel(ctx); err != nil {
			return nil, err
		}
	}
	return out[1:], nil
}

// waiting: n goroutines of one process, sharing one client, wait on a lock
// somebody else holds. Measures the connections they hold, the client memory
// they take and the Redis commands per second they cost while nobody is
// served.
func (e *env) waiting(l *lib, n int) (metrics, error) {
	c := &counters{}
	bg, cancelBg := context.WithTimeout(context.Background(), time.Minute)
	defer cancelBg()
	key := e.key(l.name, "waiting")
	if err := e.prepare(l, key, 1); err != nil {
		return nil, err
	}
	hcl, err := l.newClient(e.addr, &counters{}, false)
	if err != nil {
		return nil, err
	}
	defer hcl.close()
	hl, err := hcl.locker(key, 1)
	if err != nil {
		return nil, err
	}
	rel, err := hl.lock(bg)
	if err != nil {
		return nil, err
	}
	defer rel(bg)

	cl, err := l.newClient(e.addr, c, true)
	if err != nil {
		return nil, err
	}
	defer cl.close()
	if err := cl.warm(bg); err != nil {
		return nil, err
	}
	conns0 := e.clientsField("connected_clients")
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Value
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := cl.locker(key, 1)
			if err != nil {
				failed.Store(err)
				return
			}
			r, err := lk.lock(ctx)
			if err == nil {
				failed.Store(fmt.Errorf("%s: a waiter got a lock that is held", l.name))
				r(bg)
			}
		}()
	}
	if l.sharedWait {
		if !e.waitBlocked(1, 20*time.Second) {
			return nil, fmt.Errorf("%s: the shared wait never blocked", l.name)
		}
		time.Sleep(500 * time.Millisecond) // the rest queue in the process
	} else if l.blocking {
		if !e.waitBlocked(n, 20*time.Second) {
			return nil, fmt.Errorf("%s: %d waiters never all blocked", l.name, n)
		}
	} else {
		time.Sleep(500 * time.Millisecond)
	}
	conns := 0
	s0 := e.stats()
	t0 := time.Now()
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		conns = max(conns, e.clientsField("connected_clients")-conns0)
	}
	s1 := e.stats()
	elapsed := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	g1 := runtime.NumGoroutine()
	cancel()
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return nil, err
	}
	mem := float64(int64(m1.HeapInuse+m1.StackInuse)-int64(m0.HeapInuse+m0.StackInuse)) / 1024
	return metrics{
		"connections":      float64(conns),
		"client_mem_kib":   mem,
		"mem_per_waiter_b": mem * 1024 / float64(n),
		"goroutines":       float64(g1 - g0),
		"redis_cmds_per_s": float64(s1.calls-s0.calls) / elapsed.Seconds(),
	}, nil
}
