//go:build unix

package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

const demoHelp = `Usage: redsem demo [flags]

Starts an in-process Redis (miniredis: nothing to install), runs W workers
that each take one of the K slots of a semaphore a few times, shows who holds
which slot, and ends with a summary: the most holders ever seen at once
(never more than K), how long workers waited, and the fences they got.

  --workers W      workers (default 8)
  --size K         slots of the semaphore (default 3)
  --rounds R       acquisitions per worker (default 2)
  --work DURATION  mean time a worker holds its slot (default 400ms; each
                   hold is 50% to 150% of it)
  --ttl DURATION   lease TTL (default 10s)
  --plain          one line per event even on a terminal
  --redis URL      run against this Redis instead of the embedded one (the
                   demo's keys are deleted at the end). $REDIS_URL is not
                   used: without --redis the demo never touches a real Redis
  --prefix, --cacert, --insecure as for the other commands

Exit codes: 0 the demo ran and never saw more than K holders; 69 Redis
unavailable; 70 it saw more than K holders; 130 interrupted.

Examples:
  go -C cmd/redsem run . demo
  redsem demo --workers 20 --size 5 --work 200ms
  redsem demo --redis redis://127.0.0.1:6379/15
`

type demoOptions struct {
	conn    connFlags
	workers int
	size    int
	rounds  int
	work    durationValue
	ttl     durationValue
	plain   bool
}

func parseDemoArgs(args []string) (*demoOptions, error) {
	o := &demoOptions{}
	fs := newFlagSet("demo")
	o.conn.register(fs)
	fs.IntVar(&o.workers, "workers", 8, "")
	fs.IntVar(&o.size, "size", 3, "")
	fs.IntVar(&o.rounds, "rounds", 2, "")
	fs.Var(&o.work, "work", "")
	fs.Var(&o.ttl, "ttl", "")
	fs.BoolVar(&o.plain, "plain", false, "")
	pos, err := parseArgs(fs, args, demoHelp)
	if err != nil {
		return nil, err
	}
	switch {
	case len(pos) > 0:
		return nil, usagef("demo: unexpected argument %q (see redsem demo --help)", pos[0])
	case o.workers < 1 || o.workers > 1000:
		return nil, usagef("demo: --workers %d is not between 1 and 1000", o.workers)
	case o.size < 1 || o.size > 1000:
		return nil, usagef("demo: --size %d is not between 1 and 1000", o.size)
	case o.rounds < 1 || o.rounds > 1000:
		return nil, usagef("demo: --rounds %d is not between 1 and 1000", o.rounds)
	}
	if !o.work.set {
		o.work.d = 400 * time.Millisecond
	}
	if !o.ttl.set {
		o.ttl.d = 10 * time.Second
	}
	return o, nil
}

func cmdDemo(args []string, stdout, _ io.Writer) error {
	o, err := parseDemoArgs(args)
	if err != nil {
		return err
	}
	where := ""
	if o.conn.url == "" {
		m, err := miniredis.Run()
		if err != nil {
			return exitf(exitSoftware, "demo: cannot start the embedded Redis: %v", err)
		}
		defer m.Close()
		o.conn.url = "redis://" + m.Addr()
		where = "embedded miniredis at " + m.Addr()
	}
	p, err := connect(o.conn)
	if err != nil {
		return err
	}
	defer p.Close()
	if where == "" {
		where = p.shown
	}
	name := "demo:" + randomHex(4)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	tr := newTracker(o)
	view := newView(stdout, o, tr, name, where)
	view.start()
	err = runWorkers(ctx, p, name, o, tr)
	view.stop()

	cctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if sem, serr := admin.New(p.main, o.conn.prefix, name); serr == nil {
		_ = sem.Delete(cctx)
	}
	if ctx.Err() != nil {
		return exitf(exitSignalBase+int(syscall.SIGINT), "")
	}
	if err != nil {
		return err
	}
	printSummary(stdout, o, tr)
	if tr.max > o.size {
		return exitf(exitSoftware, "demo: saw %d holders at once on a semaphore of size %d", tr.max, o.size)
	}
	return nil
}

// runWorkers runs the workers to the end and returns the first error.
func runWorkers(ctx context.Context, p *pools, name string, o *demoOptions, tr *tracker) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, o.workers)
	var wg sync.WaitGroup
	for w := 1; w <= o.workers; w++ {
		sem, err := redsem.NewSemaphore(p.main, name, o.size,
			redsem.WithPrefix(o.conn.prefix), redsem.WithTTL(o.ttl.d), redsem.WithAutoRefresh(),
			redsem.WithBlockingPool(p.block), redsem.WithLabel(fmt.Sprintf("worker %d", w)))
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(ctx, sem, w, o, tr); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return nil
}

// work is one worker: rounds times, wait for a slot, hold it, give it back.
func work(ctx context.Context, sem *redsem.Semaphore, w int, o *demoOptions, tr *tracker) error {
	for r := 0; r < o.rounds; r++ {
		tr.waiting(w)
		start := time.Now()
		lease, err := sem.Acquire(ctx)
		if err != nil {
			tr.gaveUp(w)
			return err
		}
		hold := time.Duration(float64(o.work.d) * (0.5 + rand.Float64()))
		tr.acquired(w, lease, time.Since(start), hold)
		select {
		case <-time.After(hold):
		case <-lease.Done():
		case <-ctx.Done():
		}
		tr.releasing(w, lease)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		err = lease.Release(rctx)
		cancel()
		if err != nil {
			return fmt.Errorf("demo: worker %d: %w", w, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// tracker records what the workers do; the view reads it.
type tracker struct {
	mu      sync.Mutex
	start   time.Time
	size    int
	total   int
	done    int
	cur     int
	max     int
	wait    int
	slots   map[string]holding // slot -> who holds it
	waits   []time.Duration
	fences  map[int][]int64 // worker -> fences in the order it got them
	onEvent func(line string)
}

type holding struct {
	worker int
	fence  int64
	since  time.Time
	hold   time.Duration
}

func newTracker(o *demoOptions) *tracker {
	return &tracker{start: time.Now(), size: o.size, total: o.workers * o.rounds,
		slots: map[string]holding{}, fences: map[int][]int64{}}
}

func (t *tracker) event(format string, args ...any) {
	if t.onEvent != nil {
		t.onEvent(fmt.Sprintf("%7.3fs  ", time.Since(t.start).Seconds()) + fmt.Sprintf(format, args...))
	}
}

func (t *tracker) waiting(w int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wait++
	t.event("worker %d waits for a slot", w)
}

func (t *tracker) gaveUp(int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wait--
}

func (t *tracker) acquired(w int, l *redsem.Lease, waited, hold time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wait--
	t.cur++
	t.max = max(t.max, t.cur)
	slot := slotOf(l.Token())
	t.slots[slot] = holding{worker: w, fence: l.Fence(), since: time.Now(), hold: hold}
	t.waits = append(t.waits, waited)
	t.fences[w] = append(t.fences[w], l.Fence())
	t.event("worker %d holds slot %s (fence %d, waited %v, %d/%d slots taken)",
		w, slot, l.Fence(), waited.Round(time.Millisecond), t.cur, t.size)
}

func (t *tracker) releasing(w int, l *redsem.Lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cur--
	t.done++
	delete(t.slots, slotOf(l.Token()))
	t.event("worker %d releases slot %s", w, slotOf(l.Token()))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

func printSummary(w io.Writer, o *demoOptions, t *tracker) {
	t.mu.Lock()
	defer t.mu.Unlock()
	verdict := "OK: never more holders than slots"
	if t.max > o.size {
		verdict = "VIOLATION: more holders than slots"
	}
	waits := append([]time.Duration(nil), t.waits...)
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	var all []int64
	increasing := true
	for _, fs := range t.fences {
		for i, f := range fs {
			if i > 0 && f <= fs[i-1] {
				increasing = false
			}
			all = append(all, f)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	distinct := 0
	for i := range all {
		if i == 0 || all[i] != all[i-1] {
			distinct++
		}
	}
	fmt.Fprintln(w, "\nsummary")
	fmt.Fprintf(w, "  acquisitions     %d by %d workers in %v\n", len(waits), o.workers, time.Since(t.start).Round(time.Millisecond))
	fmt.Fprintf(w, "  max concurrency  %d of size %d: %s\n", t.max, o.size, verdict)
	if len(waits) > 0 {
		var sum time.Duration
		for _, d := range waits {
			sum += d
		}
		fmt.Fprintf(w, "  waits            min %v  median %v  mean %v  max %v\n",
			waits[0].Round(time.Millisecond), waits[len(waits)/2].Round(time.Millisecond),
			(sum / time.Duration(len(waits))).Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond))
	}
	if len(all) > 0 {
		order := "increasing for every worker"
		if !increasing {
			order = "NOT increasing for every worker"
		}
		fmt.Fprintf(w, "  fences           %d distinct of %d, %s, from %d to %d\n", distinct, len(all), order, all[0], all[len(all)-1])
	}
}
