// Command rateworker is the client process of redsem's fault suite for rate
// gates. Its goroutines loop WaitN (or AllowN) on one rate.Quota, each start
// taking a unit vector drawn from -units, and append every grant to the
// shared history file (see ../history, event "start") with its grant time
// and units. Some of its waits are cancelled on purpose (-cancelp), and it
// can kill itself at a failpoint of the acquisition (-killp): before the
// first script's reply, while blocked, or right after a grant it never
// records. Mode "mut-oneunit" is a deliberately broken client that the
// window checker must catch: it takes one unit of each limit and records
// the units it meant to take.
//
// Exit codes: 0 done, 2 bad flags or constructor error, 3 fatal library
// error, 4 history failure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/failpoint"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/rate"
)

var (
	addr     = flag.String("addr", "", "redis host:port")
	histPath = flag.String("hist", "", "history file")
	name     = flag.String("name", "faults-rate", "quota name")
	id       = flag.Int("id", 0, "worker id")
	limitsF  = flag.String("limits", "5/200ms", "comma-separated limits N/per, e.g. \"6/200ms,60/300ms\"")
	unitsF   = flag.String("units", "1", "comma-separated unit vectors, counts joined by ':', e.g. \"1:1,1:12,0:5\"; each start draws one")
	dur      = flag.Duration("dur", 3*time.Second, "stop starting after this")
	nGor     = flag.Int("goroutines", 2, "goroutines looping starts on one shared *rate.Quota")
	allowP   = flag.Float64("allowp", 0, "probability that a start is an AllowN (refused ones are not recorded)")
	cancelP  = flag.Float64("cancelp", 0, "probability that a WaitN gets a deadline of 1..cancelmax")
	cancelMx = flag.Duration("cancelmax", 60*time.Millisecond, "longest deadline of a cancelled WaitN")
	killP    = flag.Float64("killp", 0, "probability to kill -9 itself at each failpoint hit (acquire.sent, wait.sent, acquire.granted)")
	grace    = flag.Duration("grace", 200*time.Millisecond, "rate.WithGrace")
	mode     = flag.String("mode", "lib", "lib | mut-oneunit")
)

func main() {
	flag.Parse()
	if *addr == "" || *histPath == "" {
		fmt.Fprintln(os.Stderr, "rateworker: -addr and -hist are required")
		os.Exit(2)
	}
	limits, err := parseLimits(*limitsF)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rateworker: -limits:", err)
		os.Exit(2)
	}
	choices, err := parseUnits(*unitsF, len(limits))
	if err != nil {
		fmt.Fprintln(os.Stderr, "rateworker: -units:", err)
		os.Exit(2)
	}
	hw, err := history.Open(*histPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rateworker:", err)
		os.Exit(4)
	}
	pid := os.Getpid()
	emit := func(e history.Event) {
		e.W, e.Pid = *id, pid
		if err := hw.Write(e); err != nil {
			fmt.Fprintln(os.Stderr, "rateworker: history:", err)
			os.Exit(4)
		}
	}
	pool := &redis.Pool{MaxIdle: *nGor + 4, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", *addr, redis.DialConnectTimeout(2*time.Second))
	}}
	defer pool.Close()
	q, err := rate.NewQuota(pool, *name, limits, rate.WithGrace(*grace))
	if err != nil {
		fmt.Fprintln(os.Stderr, "rateworker:", err)
		os.Exit(2)
	}
	if *killP > 0 {
		failpoint.Set(func(point string) bool {
			switch point {
			case "acquire.sent", "wait.sent", "acquire.granted":
				if rand.Float64() < *killP {
					emit(history.Event{K: history.KFPKill, Class: point})
					_ = syscall.Kill(pid, syscall.SIGKILL)
					select {}
				}
			}
			return false
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	fatal := make(chan error, *nGor)
	var wg sync.WaitGroup
	for g := 0; g < *nGor; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				units := choices[rand.IntN(len(choices))]
				take := units
				if *mode == "mut-oneunit" {
					take = make([]int, len(units))
					for i := range take {
						take[i] = 1
					}
				}
				st, err := start(ctx, q, take)
				switch {
				case err == nil:
					emit(history.Event{K: history.KStart, G: g, T: st.At.UnixMicro(), Units: units})
				case errors.Is(err, rate.ErrRateLimited):
					time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
				case ctx.Err() != nil:
					return
				case errors.Is(err, context.DeadlineExceeded):
					emit(history.Event{K: history.KCancel, G: g})
				default:
					emit(history.Event{K: history.KFatal, G: g, Err: err.Error()})
					fatal <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(fatal)
	if err := <-fatal; err != nil {
		fmt.Fprintln(os.Stderr, "rateworker:", err)
		os.Exit(3)
	}
	emit(history.Event{K: history.KExit})
}

// start takes one start: an AllowN, a WaitN, or a WaitN with a short
// deadline (likely cancelled), as the flags draw.
func start(ctx context.Context, q *rate.Quota, units []int) (rate.Start, error) {
	if rand.Float64() < *allowP {
		return q.AllowN(ctx, units...)
	}
	if rand.Float64() < *cancelP {
		wctx, cancel := context.WithTimeout(ctx, time.Millisecond+rand.N(*cancelMx))
		defer cancel()
		return q.WaitN(wctx, units...)
	}
	return q.WaitN(ctx, units...)
}

func parseLimits(s string) ([]rate.Limit, error) {
	var out []rate.Limit
	for _, f := range strings.Split(s, ",") {
		n, per, ok := strings.Cut(strings.TrimSpace(f), "/")
		if !ok {
			return nil, fmt.Errorf("%q is not N/per", f)
		}
		l := rate.Limit{}
		var err error
		if l.N, err = strconv.Atoi(n); err != nil {
			return nil, err
		}
		if l.Per, err = time.ParseDuration(per); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func parseUnits(s string, limits int) ([][]int, error) {
	var out [][]int
	for _, f := range strings.Split(s, ",") {
		var v []int
		for _, c := range strings.Split(strings.TrimSpace(f), ":") {
			u, err := strconv.Atoi(c)
			if err != nil {
				return nil, err
			}
			v = append(v, u)
		}
		if len(v) != limits {
			return nil, fmt.Errorf("%q has %d counts for %d limits", f, len(v), limits)
		}
		out = append(out, v)
	}
	return out, nil
}
