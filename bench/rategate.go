package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/rate"
)

// The rate scenario: 64 goroutines start calls as fast as a gate of n
// starts per interval lets them, for dur, through redsem's rate gate
// (package rate) and through the common hand-made fixed-window limiter (INCR on a key per
// window, PEXPIRE, sleep to the next window when over). It reports the
// achieved rate against the configured one, the most starts seen in any
// window of length per (n is the limit; a fixed window lets up to 2n
// through across a boundary), and the spacing of starts.
const (
	rateN       = 20
	ratePer     = 250 * time.Millisecond
	rateWorkers = 64
)

func (e *env) rate(dur time.Duration) (metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	gateStarts, err := e.rateRun(ctx, dur, e.redsemStart)
	if err != nil {
		return nil, err
	}
	fwStarts, err := e.rateRun(ctx, dur, e.fixedWindowStart)
	if err != nil {
		return nil, err
	}
	m := metrics{"configured_per_s": float64(rateN) / ratePer.Seconds()}
	for prefix, starts := range map[string][]time.Duration{"": gateStarts, "fw_": fwStarts} {
		m[prefix+"achieved_per_s"] = float64(len(starts)) / dur.Seconds()
		m[prefix+"worst_window"] = float64(worstWindow(starts, ratePer))
		gaps := make([]float64, 0, len(starts))
		for i := 1; i < len(starts); i++ {
			gaps = append(gaps, us(starts[i]-starts[i-1]))
		}
		m[prefix+"gap_p50_us"] = percentile(slices.Clone(gaps), 0.5)
		m[prefix+"gap_p99_us"] = percentile(slices.Clone(gaps), 0.99)
	}
	return m, nil
}

// starter waits for one start and returns when it was granted.
type starter func(ctx context.Context, pool *redis.Pool, key string) (func(context.Context) error, error)

// rateRun runs rateWorkers goroutines through start for dur and returns the
// start times (since the run began), sorted.
func (e *env) rateRun(ctx context.Context, dur time.Duration, start starter) ([]time.Duration, error) {
	pool := &redis.Pool{MaxIdle: rateWorkers + 4, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", e.addr)
	}}
	defer pool.Close()
	key := e.key("rate", strconv.Itoa(rand.IntN(1<<30)))
	wait, err := start(ctx, pool, key)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var starts []time.Duration
	var failed error
	t0 := time.Now()
	end := t0.Add(dur)
	rctx, rcancel := context.WithDeadline(ctx, end)
	defer rcancel()
	var wg sync.WaitGroup
	for range rateWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := wait(rctx)
				if err != nil {
					if rctx.Err() == nil {
						mu.Lock()
						failed = err
						mu.Unlock()
					}
					return
				}
				at := time.Since(t0)
				if at > dur {
					return
				}
				mu.Lock()
				starts = append(starts, at)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	return starts, failed
}

func (e *env) redsemStart(_ context.Context, pool *redis.Pool, key string) (func(context.Context) error, error) {
	g, err := rate.New(pool, key, rateN, ratePer)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { _, err := g.Wait(ctx); return err }, nil
}

// fixedWindowStart is the limiter people write by hand: a counter per
// window of length per; over the limit, sleep to the next window.
func (e *env) fixedWindowStart(_ context.Context, pool *redis.Pool, key string) (func(context.Context) error, error) {
	perMs := ratePer.Milliseconds()
	return func(ctx context.Context) error {
		for {
			now := time.Now().UnixMilli()
			window := now / perMs
			conn, err := pool.GetContext(ctx)
			if err != nil {
				return err
			}
			k := fmt.Sprintf("%s:%d", key, window)
			n, err := redis.Int(redis.DoContext(conn, ctx, "INCR", k))
			if err == nil && n == 1 {
				_, err = redis.DoContext(conn, ctx, "PEXPIRE", k, 2*perMs)
			}
			conn.Close()
			if err != nil {
				return err
			}
			if n <= rateN {
				return nil
			}
			next := time.UnixMilli((window+1)*perMs + rand.Int64N(3))
			t := time.NewTimer(time.Until(next))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}, nil
}

// worstWindow is the most starts in any window of length per.
func worstWindow(starts []time.Duration, per time.Duration) int {
	worst, j := 0, 0
	for i := range starts {
		for starts[i]-starts[j] >= per {
			j++
		}
		worst = max(worst, i-j+1)
	}
	return worst
}

// The weighted rate scenario: 64 goroutines take starts of mixed sizes
// (unitSizes, drawn at random) from a gate of unitsN units per unitsPer with
// WaitN, for several windows. It reports the units per second achieved
// against the configured rate, over the whole windows after the first (the
// first is an empty window's burst), the most units in any window (unitsN is the
// limit), and how long WaitN waited: overall and for the largest size,
// which FIFO must not starve behind the small ones.
const unitsN, unitsPer = 400, 250 * time.Millisecond

var unitSizes = []int{1, 4, 16, 64}

func (e *env) rateUnits(dur time.Duration) (metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	pool := &redis.Pool{MaxIdle: rateWorkers + 4, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", e.addr)
	}}
	defer pool.Close()
	g, err := rate.New(pool, e.key("rate-units", strconv.Itoa(rand.IntN(1<<30))), unitsN, unitsPer)
	if err != nil {
		return nil, err
	}
	type grant struct {
		at    time.Time // Redis TIME
		units int
		wait  time.Duration
	}
	var mu sync.Mutex
	var grants []grant
	var failed error
	rctx, rcancel := context.WithTimeout(ctx, dur)
	defer rcancel()
	var wg sync.WaitGroup
	for range rateWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := unitSizes[rand.IntN(len(unitSizes))]
				t := time.Now()
				st, err := g.WaitN(rctx, k)
				if err != nil {
					// The window's end, seen by the wait (its deadline can
					// fire in a read before rctx's own timer) is not a
					// failure.
					if rctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						failed = err
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				grants = append(grants, grant{st.At, k, time.Since(t)})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		return nil, failed
	}
	if len(grants) == 0 {
		return nil, fmt.Errorf("no starts")
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
	// Steady state: the whole windows after the first, [per, (k+1)per),
	// which can hold at most k*unitsN units.
	first := grants[0].at
	k := time.Duration(grants[len(grants)-1].at.Sub(first)/unitsPer) - 1
	var steady int
	var waits, largeWaits []float64
	times := make([]time.Duration, 0, len(grants))
	units := make([]int, 0, len(grants))
	for _, gr := range grants {
		since := gr.at.Sub(first)
		times, units = append(times, since), append(units, gr.units)
		if since >= unitsPer && since < (k+1)*unitsPer {
			steady += gr.units
		}
		waits = append(waits, us(gr.wait))
		if gr.units == unitSizes[len(unitSizes)-1] {
			largeWaits = append(largeWaits, us(gr.wait))
		}
	}
	m := metrics{
		"configured_units_per_s": float64(unitsN) / unitsPer.Seconds(),
		"worst_window_units":     float64(worstWindowUnits(times, units, unitsPer)),
		"starts":                 float64(len(grants)),
		"wait_p50_us":            percentile(slices.Clone(waits), 0.5),
		"wait_p99_us":            percentile(slices.Clone(waits), 0.99),
		"wait_p99_large_us":      percentile(largeWaits, 0.99),
	}
	if k > 0 {
		m["achieved_units_per_s"] = float64(steady) / (k * unitsPer).Seconds()
		m["achieved_ratio"] = m["achieved_units_per_s"] / m["configured_units_per_s"]
	}
	return m, nil
}

// worstWindowUnits is the most units granted in any window of length per
// (times sorted).
func worstWindowUnits(times []time.Duration, units []int, per time.Duration) int {
	worst, sum, j := 0, 0, 0
	for i := range times {
		sum += units[i]
		for times[i]-times[j] >= per {
			sum -= units[j]
			j++
		}
		worst = max(worst, sum)
	}
	return worst
}
