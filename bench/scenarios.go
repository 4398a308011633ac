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
		serverUs, cpuUs       float64
		perCmd                map[string][2]int64 // calls, usec by command (inner included)
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
			s.serverUs += serverUsec(s0, s1, sentSince(&s.c, sent0))
			s.cpuUs += serverCPU(s0, s1)
			s.perCmd = addCommands(s.perCmd, s0, s1)
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
			"cpu_us":           s.cpuUs / fn,
		}
		perCommand(out[ls[i].name], s.perCmd, fn)
	}
	return out, nil
}

// Per-command figures: cmdCalls+name is the calls of one command per pair
// (inner commands of scripts included), cmdUs+name its server µs per pair
// (a script's includes those of the commands it ran), from INFO
// commandstats.
const (
	cmdCalls = "cmd_calls:"
	cmdUs    = "cmd_us:"
)

// addCommands adds to m (calls, usec by command; nil for a new one) what
// commandstats counted between s0 and s1, the harness's INFO aside.
func addCommands(m map[string][2]int64, s0, s1 stats) map[string][2]int64 {
	if m == nil {
		m = map[string][2]int64{}
	}
	for name, v := range s1.byName {
		if d := v[0] - s0.byName[name][0]; d > 0 && name != "info" {
			p := m[name]
			m[name] = [2]int64{p[0] + d, p[1] + v[1] - s0.byName[name][1]}
		}
	}
	return m
}

// perCommand puts m's figures into out, per pair of n.
func perCommand(out metrics, m map[string][2]int64, n float64) {
	for name, v := range m {
		out[cmdCalls+name] = float64(v[0]) / n
		out[cmdUs+name] = float64(v[1]) / n
	}
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
	wcs := make([]*counters, workers)
	for i := range workers {
		wcs[i] = c.child()
		cl, err := l.newClient(e.addr, wcs[i], false)
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
		rtAcq    int64 // round trips in lock calls that counted
		rtRel    int64 // and in their releases
		waits    []float64
		censored float64 // wait still unserved at the deadline, µs
		busy     time.Duration
		holds    []float64 // how long each time.Sleep(hold) took, µs
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
		go func(w *worker, lk locker, wc *counters) {
			defer wg.Done()
			<-startCh
			for {
				t := time.Now()
				if !t.Before(deadline) {
					return
				}
				r0 := wc.roundTrips.Load()
				rel, err := lk.lock(ctx)
				got := time.Now()
				r1 := wc.roundTrips.Load()
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
					w.rtAcq += r1 - r0
					w.waits = append(w.waits, us(got.Sub(t)))
				} else if !in {
					w.censored = us(deadline.Sub(t))
				}
				if hold > 0 {
					time.Sleep(hold)
				}
				end := time.Now()
				if counted && hold > 0 {
					w.holds = append(w.holds, us(end.Sub(got)))
				}
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
				if counted {
					w.rtRel += wc.roundTrips.Load() - r1
				}
				if !in {
					return
				}
			}
		}(&res[i], lockers[i], wcs[i])
	}
	win := e.measureWindow(c, startCh, dur, &from, &deadline)
	cancel()
	wg.Wait()

	var waits, per, holds []float64
	var total, starved int
	var rtAcq, rtRel int64
	var busy time.Duration
	maxWait := 0.0
	for _, w := range res {
		if w.err != nil {
			return nil, w.err
		}
		total += w.acqs
		rtAcq += w.rtAcq
		rtRel += w.rtRel
		per = append(per, float64(w.acqs))
		if w.acqs == 0 {
			starved++
		}
		waits = append(waits, w.waits...)
		holds = append(holds, w.holds...)
		busy += w.busy
		maxWait = math.Max(maxWait, math.Max(w.censored, maxOf(append([]float64{0}, w.waits...))))
	}
	ft := float64(max(total, 1))
	m := metrics{
		"acq_per_s":   float64(total) / dur.Seconds(),
		"wait_p50_us": percentile(waits, 0.5),
		"wait_p99_us": percentile(waits, 0.99),
		"wait_max_us": maxWait,
		"jain":        jain(per),
		"starved":     float64(starved),
		// Round trips within the lock calls (and their releases) that
		// counted: those of one acquisition, whoever made them.
		"roundtrips_acq": float64(rtAcq) / ft,
		"roundtrips_rel": float64(rtRel) / ft,
		// Both, per acquisition and its release (the window's edges aside).
		"roundtrips_acq_rel": float64(rtAcq+rtRel) / ft,
		"max_holders":        float64(maxHolders.Load()),
		"utilisation":        busy.Seconds() / (float64(size) * dur.Seconds()),
	}
	if hold > 0 {
		// The holder's sleep as it ran: Go wakes a sleeper at 1 ms after
		// the process last went idle at the earliest (see README).
		m["hold_p50_us"] = percentile(holds, 0.5)
	}
	win.add(m, ft)
	return m, nil
}

// handoff: a waiter is blocked, the holder releases at t0; the sample is the
// time until the waiter holds the lock. Returns the samples in µs, and per
// pair (a trial is two: the holder's and the waiter's) the Redis commands
// and server µs, and the round trips of the waiter's lock call per trial.
// Redis figures cover the trials only: every pair has dialled and warmed up
// before the first sample.
func (e *env) handoff(l *lib, trials int) ([]float64, metrics, error) {
	pairs := max(1, l.parallel)
	per := (trials + pairs - 1) / pairs
	samples := make([][]float64, pairs)
	errs := make([]error, pairs)
	waiterRTs := make([]int64, pairs)
	c := &counters{}
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	for p := range pairs {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			samples[p], waiterRTs[p], errs[p] = e.handoffPair(l, per, pairs == 1, c, sync.OnceFunc(ready.Done), start)
		}()
	}
	ready.Wait()
	sent0 := c.sentByName()
	s0 := e.stats()
	close(start)
	wg.Wait()
	s1 := e.stats()
	var all []float64
	var rts int64
	for p := range pairs {
		if errs[p] != nil {
			return nil, nil, errs[p]
		}
		all = append(all, samples[p]...)
		rts += waiterRTs[p]
	}
	n := float64(max(len(all), 1))
	m := metrics{
		"redis_cmds":     float64(s1.calls-s0.calls) / (2 * n),
		"server_us":      serverUsec(s0, s1, sentSince(c, sent0)) / (2 * n),
		"cpu_us":         serverCPU(s0, s1) / (2 * n),
		"roundtrips_acq": float64(rts) / n,
	}
	perCommand(m, addCommands(nil, s0, s1), 2*n)
	return all, m, nil
}

// handoffPair runs trials handoffs on one holder and one waiter, both
// counting into c. It calls ready once warmed up (or failed) and starts the
// trials when start is closed. It returns the samples and the round trips
// of the waiter's lock calls in them.
func (e *env) handoffPair(l *lib, trials int, alone bool, c *counters, ready func(), start <-chan struct{}) ([]float64, int64, error) {
	defer ready()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := e.key(l.name, "handoff")
	if err := e.prepare(l, key, 1); err != nil {
		return nil, 0, err
	}
	var lks [2]locker
	wc := c.child()
	for i, cc := range []*counters{c, wc} {
		cl, err := l.newClient(e.addr, cc, false)
		if err != nil {
			return nil, 0, err
		}
		defer cl.close()
		if err := cl.warm(ctx); err != nil {
			return nil, 0, err
		}
		if lks[i], err = cl.locker(key, 1); err != nil {
			return nil, 0, err
		}
	}
	holder, waiterLk := lks[0], lks[1]
	type got struct {
		at  time.Time
		rts int64
		rel func(context.Context) error
		err error
	}
	out := make([]float64, 0, trials)
	var rts int64
	for i := range trials + 1 { // the first trial warms up the waiter
		if i == 1 {
			ready()
			<-start
		}
		rel, err := holder.lock(ctx)
		if err != nil {
			return nil, 0, err
		}
		ch := make(chan got, 1)
		go func() {
			r0 := wc.roundTrips.Load()
			r, err := waiterLk.lock(ctx)
			ch <- got{time.Now(), wc.roundTrips.Load() - r0, r, err}
		}()
		if l.blocking && alone && !e.waitBlocked(1, 5*time.Second) {
			return nil, 0, fmt.Errorf("%s: waiter never blocked", l.name)
		}
		time.Sleep(l.settle + time.Duration(rand.Int64N(int64(l.jitter)+1)))
		t0 := time.Now()
		if err := rel(ctx); err != nil {
			return nil, 0, err
		}
		g := <-ch
		if g.err != nil {
			return nil, 0, g.err
		}
		out = append(out, us(g.at.Sub(t0)))
		if i > 0 {
			rts += g.rts
		}
		if err := g.rel(ctx); err != nil {
			return nil, 0, err
		}
	}
	return out[1:], rts, nil
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
	sent0 := c.sentByName()
	s0 := e.stats()
	t0 := time.Now()
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		conns = max(conns, e.clientsField("connected_clients")-conns0)
	}
	s1 := e.stats()
	elapsed := time.Since(t0)
	sent := sentSince(c, sent0)
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
		"server_us_per_s":  serverUsec(s0, s1, sent) / elapsed.Seconds(),
		"cpu_us_per_s":     serverCPU(s0, s1) / elapsed.Seconds(),
	}, nil
}
