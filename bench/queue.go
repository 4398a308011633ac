package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// queuePool is the most connections the queue scenario's process may open.
const queuePool = 8

// queue: n goroutines of one process wait on one redsem semaphore of size 1
// through a pool of at most poolSize connections (redsem's shared waiting:
// they queue in the process behind one blocking call). While they wait it
// samples Redis connections, client memory and Redis commands per second;
// then the holder releases and every waiter takes the lock and gives it
// back in turn: drain time, acquisitions per second, and per pair the round
// trips, Redis commands and server µs.
func (e *env) queue(l *lib, n, poolSize int) (metrics, error) {
	bg, cancelBg := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelBg()
	key := e.key(l.name, "queue")
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

	c := &counters{}
	pool := &countingPool{c: c, pool: &redis.Pool{
		MaxIdle: poolSize, MaxActive: poolSize, Wait: true,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", e.addr, redis.DialConnectTimeout(5*time.Second))
		},
	}}
	defer pool.Close()
	sem, err := redsem.NewSemaphore(pool, key, 1)
	if err != nil {
		return nil, err
	}
	conns0 := e.clientsField("connected_clients")
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)

	var wg sync.WaitGroup
	var started, served atomic.Int64
	var failed atomic.Value
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started.Add(1)
			lease, err := sem.Acquire(bg)
			if err != nil {
				failed.Store(err)
				return
			}
			served.Add(1)
			if err := lease.Release(bg); err != nil {
				failed.Store(err)
			}
		}()
	}
	for started.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // all queued behind the pump
	if served.Load() != 0 {
		return nil, fmt.Errorf("%s: a waiter got a lock that is held", l.name)
	}
	conns := 0
	s0 := e.stats()
	t0 := time.Now()
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		conns = max(conns, e.clientsField("connected_clients")-conns0)
	}
	s1 := e.stats()
	idle := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&m1)

	rt0, _ := c.snapshot()
	sent0 := c.sentByName()
	d0s := e.stats()
	d0 := time.Now()
	if err := rel(bg); err != nil {
		return nil, err
	}
	wg.Wait()
	drain := time.Since(d0)
	d1s := e.stats()
	rt1, _ := c.snapshot()
	sent := sentSince(c, sent0)
	if err, ok := failed.Load().(error); ok {
		return nil, err
	}
	if served.Load() != int64(n) {
		return nil, fmt.Errorf("%s: %d of %d waiters served", l.name, served.Load(), n)
	}
	mem := float64(int64(m1.HeapInuse+m1.StackInuse)-int64(m0.HeapInuse+m0.StackInuse)) / 1024
	return metrics{
		"connections":      float64(conns),
		"client_mem_kib":   mem,
		"mem_per_waiter_b": mem * 1024 / float64(n),
		"redis_cmds_per_s": float64(s1.calls-s0.calls) / idle.Seconds(),
		"drain_s":          drain.Seconds(),
		"acq_per_s":        float64(n) / drain.Seconds(),
		// While draining, per pair (the holder's release is one more).
		"roundtrips": float64(rt1-rt0) / float64(n),
		"redis_cmds": float64(d1s.calls-d0s.calls) / float64(n),
		"server_us":  serverUsec(d0s, d1s, sent) / float64(n),
		"cpu_us":     serverCPU(d0s, d1s) / float64(n),
	}, nil
}
