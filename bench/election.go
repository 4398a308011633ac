package main

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// The election scenario (redsem.NewElection, redsem only): how soon an
// observer, blocked in Redis, learns that the leader went.
//
// Resign: a leader campaigns, an observer (another client) reports it, then
// the leader resigns; the figure is from the call of Resign to the
// observer's "no leader", electionResigns times.
//
// Crash: a leader with a TTL of electionTTL is cut off from Redis (every
// command of its client fails, as for a process killed or partitioned); the
// observer reports "no leader" once the lease has expired. The figures are
// how long after the lease's deadline in Redis (ZSCORE of the lease, Redis
// TIME) the observer was told (its own Redis TIME right after), and how long
// after the cut, against the TTL, electionCrashes times.
const (
	electionResigns = 200
	electionCrashes = 5
	electionTTL     = 300 * time.Millisecond
)

func (e *env) election() (metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := e.key("redsem", "election")
	obsPool := newRedigoPool(e.addr, &counters{}, true)
	defer obsPool.Close()
	observer, err := redsem.NewElection(obsPool, key)
	if err != nil {
		return nil, err
	}
	changes := make(chan redsem.Leader, 16)
	octx, stop := context.WithCancel(ctx)
	observed := make(chan error, 1)
	go func() { observed <- observer.Observe(octx, func(l redsem.Leader) { changes <- l }) }()
	defer func() { stop(); <-observed }()
	next := func() (redsem.Leader, time.Time, error) {
		select {
		case l := <-changes:
			return l, time.Now(), nil
		case <-ctx.Done():
			return redsem.Leader{}, time.Time{}, ctx.Err()
		}
	}
	if _, _, err := next(); err != nil { // the current leader: none
		return nil, err
	}

	var cut atomic.Bool
	leaderPool := &cutPool{pool: newRedigoPool(e.addr, &counters{}, true), cut: &cut}
	defer leaderPool.pool.Close()
	m := metrics{}
	var resigns []float64
	for range electionResigns {
		el, err := redsem.NewElection(leaderPool, key)
		if err != nil {
			return nil, err
		}
		lead, err := el.Campaign(ctx, "leader")
		if err != nil {
			return nil, err
		}
		if _, _, err := next(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := lead.Resign(ctx); err != nil {
			return nil, err
		}
		l, at, err := next()
		if err != nil {
			return nil, err
		}
		if l.Term != 0 {
			return nil, errors.New("election: a leader reported after the resign")
		}
		resigns = append(resigns, float64(at.Sub(t0).Microseconds()))
	}
	m["resign_p50_us"], m["resign_p99_us"], m["resign_max_us"] = percentile(slices.Clone(resigns), 0.5),
		percentile(slices.Clone(resigns), 0.99), maxOf(resigns)

	var lags, sinceCut []float64
	for range electionCrashes {
		cut.Store(false)
		el, err := redsem.NewElection(leaderPool, key, redsem.WithTTL(electionTTL))
		if err != nil {
			return nil, err
		}
		if _, err := el.Campaign(ctx, "doomed"); err != nil {
			return nil, err
		}
		if _, _, err := next(); err != nil {
			return nil, err
		}
		cut.Store(true)
		cutAt := time.Now()
		l, at, err := next()
		if err != nil {
			return nil, err
		}
		nowMs, err := e.redisMs()
		if err != nil {
			return nil, err
		}
		if l.Term != 0 {
			return nil, errors.New("election: a leader reported after the crash")
		}
		dl, err := e.lastDeadlineMs(key)
		if err != nil {
			return nil, err
		}
		lags = append(lags, float64(nowMs-dl))
		sinceCut = append(sinceCut, float64(at.Sub(cutAt).Milliseconds()))
	}
	m["crash_lag_p50_ms"], m["crash_lag_max_ms"] = percentile(slices.Clone(lags), 0.5), maxOf(lags)
	m["crash_notice_max_ms"], m["ttl_ms"] = maxOf(sinceCut), float64(electionTTL.Milliseconds())
	return m, nil
}

// redisMs is Redis TIME in ms.
func (e *env) redisMs() (int64, error) {
	t, err := redis.Int64s(e.do("TIME"))
	if err != nil {
		return 0, err
	}
	return t[0]*1000 + t[1]/1000, nil
}

// lastDeadlineMs is the deadline (Redis TIME, ms) of the election key's
// lease, which nobody reclaimed yet.
func (e *env) lastDeadlineMs(key string) (int64, error) {
	v, err := redis.Strings(e.do("ZRANGE", redsem.DefaultPrefix+"{"+key+"}:el:leases", 0, 0, "WITHSCORES"))
	if err != nil {
		return 0, err
	}
	if len(v) != 2 {
		return 0, errors.New("election: no lease recorded after the crash")
	}
	ms, err := strconv.ParseInt(v[1], 10, 64)
	return ms, err
}

// cutPool fails every connection while cut is set, as a leader's client
// cut off from Redis.
type cutPool struct {
	pool *countingPool
	cut  *atomic.Bool
}

func (p *cutPool) GetContext(ctx context.Context) (redis.Conn, error) {
	if p.cut.Load() {
		return nil, errors.New("bench: leader cut off")
	}
	return p.pool.GetContext(ctx)
}
