package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/redsem/redsem"
)

// The read-write lock scenarios (redsem.NewRWMutex, redsem only).
//
// rwlock/readers: readers-only throughput against the semaphore's. rwReaders
// goroutines, each with its own client, loop RLock → hold → Release through
// the contended loop, and the same goroutines loop Acquire → hold → Release
// on a semaphore of size rwReaders in the same repetition, so that nobody
// waits on either: what differs is the cost of each lock's pair.
//
// rwlock/writer: the wait of a writer under a steady read load.
// rwLoadReaders goroutines loop RLock → hold rwReadHold → Release without
// pause; one more goroutine calls Lock every rwWritePeriod, holds it
// rwWriteHold and releases it. Figures: the writer's waits, the readers'
// throughput and waits meanwhile, and per pair (reads and writes alike) the
// round trips, Redis commands, Redis µs and Redis CPU µs.
const (
	rwReaders      = 16
	rwHold         = time.Millisecond
	rwLoadReaders  = 8
	rwReadHold     = 2 * time.Millisecond
	rwWritePeriod  = 50 * time.Millisecond
	rwWriteHold    = time.Millisecond
	rwWriterWindow = 4 // the writer scenario's window, in contended windows
)

// rwReadLib is the read side of redsem's RWMutex as a lib, so that the
// contended loop measures it as it measures the semaphore.
var rwReadLib = &lib{name: "redsem:rwmutex", kind: "redsem", blocking: true, parallel: 1,
	newClient: func(addr string, c *counters, shared bool) (client, error) {
		return &rwClient{pool: newRedigoPool(addr, c, shared)}, nil
	}}

// rwClient takes the read side of an RWMutex per key; the size is ignored.
type rwClient struct{ pool *countingPool }

func (r *rwClient) warm(ctx context.Context) error { return warmRedigo(ctx, r.pool) }
func (r *rwClient) close()                         { r.pool.Close() }

func (r *rwClient) locker(key string, _ int) (locker, error) {
	m, err := redsem.NewRWMutex(r.pool, key)
	if err != nil {
		return nil, err
	}
	return rLocker{m}, nil
}

type rLocker struct{ m *redsem.RWMutex }

func (l rLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	lease, err := l.m.RLock(ctx)
	if err != nil {
		return nil, err
	}
	return lease.Release, nil
}

// rwReadersVsSemaphore runs the contended loop on the RWMutex's read side
// and on l's semaphore of size rwReaders; first selects which goes first.
// The semaphore's figures carry the prefix "sem_", and ratio_acq_per_s is
// the RWMutex's acquisitions per second over the semaphore's.
func (e *env) rwReadersVsSemaphore(l *lib, dur time.Duration, first int) (metrics, error) {
	var rw, sem metrics
	for i := range 2 {
		var err error
		if (i+first)%2 == 0 {
			rw, err = e.contended(rwReadLib, rwReaders, rwReaders, rwHold, dur)
		} else {
			sem, err = e.contended(l, rwReaders, rwReaders, rwHold, dur)
		}
		if err != nil {
			return nil, err
		}
	}
	m := metrics{"ratio_acq_per_s": rw["acq_per_s"] / sem["acq_per_s"]}
	for k, v := range rw {
		m[k] = v
	}
	for k, v := range sem {
		m["sem_"+k] = v
	}
	return m, nil
}

// rwWriter runs the writer scenario for a window of dur after a warm-up of
// dur/5; a wait counts when its lock call returns within the window.
func (e *env) rwWriter(dur time.Duration) (metrics, error) {
	c := &counters{}
	key := e.key("redsem", "rwlock-writer")
	bg, cancelBg := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancelBg()
	mutexes := make([]*redsem.RWMutex, rwLoadReaders+1) // the last is the writer's
	for i := range mutexes {
		pool := newRedigoPool(e.addr, c.child(), false)
		defer pool.Close()
		if err := warmRedigo(bg, pool); err != nil {
			return nil, err
		}
		m, err := redsem.NewRWMutex(pool, key)
		if err != nil {
			return nil, err
		}
		mutexes[i] = m
	}
	// Create the lock and load the scripts before the clock starts.
	lease, err := mutexes[rwLoadReaders].Lock(bg)
	if err != nil {
		return nil, err
	}
	if err := lease.Release(bg); err != nil {
		return nil, err
	}

	type worker struct {
		acqs     int
		waits    []float64
		censored float64 // wait still unserved at the deadline, µs
		err      error
	}
	res := make([]worker, rwLoadReaders+1)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	startCh := make(chan struct{})
	var from, deadline time.Time
	// loop takes the lock once per call of next, which sleeps as it must
	// before the next try and says whether to go on.
	loop := func(w *worker, lock func(context.Context) (*redsem.Lease, error), hold time.Duration, next func(t time.Time) bool) {
		<-startCh
		for {
			t := time.Now()
			if !t.Before(deadline) || !next(t) {
				return
			}
			t = time.Now()
			lease, err := lock(ctx)
			got := time.Now()
			if err != nil {
				if ctx.Err() == nil {
					w.err = err
				}
				w.censored = us(deadline.Sub(t))
				return
			}
			in := got.Before(deadline)
			if in && !got.Before(from) {
				w.acqs++
				w.waits = append(w.waits, us(got.Sub(t)))
			} else if !in {
				w.censored = us(deadline.Sub(t))
			}
			time.Sleep(hold)
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = lease.Release(rctx)
			rcancel()
			if err != nil {
				w.err = fmt.Errorf("release: %w", err)
				return
			}
			if !in {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for i := range rwLoadReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(&res[i], mutexes[i].RLock, rwReadHold, func(time.Time) bool { return true })
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last time.Time
		loop(&res[rwLoadReaders], mutexes[rwLoadReaders].Lock, rwWriteHold, func(t time.Time) bool {
			if !last.IsZero() {
				// Every rwWritePeriod from the last call's start; at once
				// when the last call took longer than that.
				select {
				case <-time.After(time.Until(last.Add(rwWritePeriod))):
				case <-ctx.Done():
					return false
				}
				if !time.Now().Before(deadline) {
					return false
				}
			}
			last = time.Now()
			return true
		})
	}()
	win := e.measureWindow(c, startCh, dur, &from, &deadline)
	cancel()
	wg.Wait()

	var reads int
	var readWaits []float64
	readMax := 0.0
	for _, w := range res[:rwLoadReaders] {
		if w.err != nil {
			return nil, w.err
		}
		reads += w.acqs
		readWaits = append(readWaits, w.waits...)
		readMax = math.Max(readMax, math.Max(w.censored, maxOf(append([]float64{0}, w.waits...))))
	}
	wr := res[rwLoadReaders]
	if wr.err != nil {
		return nil, wr.err
	}
	writeMax := math.Max(wr.censored, maxOf(append([]float64{0}, wr.waits...)))
	pairs := float64(max(reads+wr.acqs, 1))
	m := metrics{
		"writes":            float64(wr.acqs),
		"write_wait_p50_us": percentile(slices.Clone(wr.waits), 0.5),
		"write_wait_p99_us": percentile(slices.Clone(wr.waits), 0.99),
		"write_wait_max_us": writeMax,
		"reads_per_s":       float64(reads) / dur.Seconds(),
		"read_wait_p50_us":  percentile(slices.Clone(readWaits), 0.5),
		"read_wait_p99_us":  percentile(slices.Clone(readWaits), 0.99),
		"read_wait_max_us":  readMax,
	}
	win.add(m, pairs)
	return m, nil
}
