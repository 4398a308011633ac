// Command bench measures redsem against the Redis round trip and against the
// locks a Go user would pick instead, in one run, on a redis-server it starts
// itself on a free loopback port. See README.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// config says how much of everything a run does.
type config struct {
	Quick   bool          `json:"quick"`
	Reps    int           `json:"reps"`
	Pairs   int           `json:"uncontended_pairs"`
	Dur     time.Duration `json:"contended_window_ns"`
	Trials  int           `json:"handoff_trials_per_rep"`
	Waiters int           `json:"waiters"`
	Queue   int           `json:"queue_waiters"`
	RateDur time.Duration `json:"rate_window_ns"`
}

// The contended scenarios' locks: mutexes under 8 and 64 goroutines, and a
// semaphore of semK tokens under semW, each holding 0 and 1 ms.
const semK, semW = 4, 16

var holds = []time.Duration{0, time.Millisecond}

// A scenario is one table of the report.
type scenario struct {
	name string
	run  func(e *env, l *lib) (metrics, []float64, error)
	// all, when set, runs every library at once instead of run.
	all func(e *env, ls []*lib) (map[string]metrics, error)
	// ok, when set, says which libraries take part (besides their own in).
	ok func(l *lib) bool
}

// takesPart reports whether l takes part in sc.
func (sc scenario) takesPart(l *lib) bool {
	if len(l.in) > 0 && !slices.ContainsFunc(l.in, func(p string) bool { return strings.HasPrefix(sc.name, p) }) {
		return false
	}
	return sc.ok == nil || sc.ok(l)
}

func scenarios(cfg config) []scenario {
	rwRuns := 0
	redsemOnly := func(l *lib) bool { return l.name == "redsem" }
	list := []scenario{{
		name: "uncontended",
		all: func(e *env, ls []*lib) (map[string]metrics, error) {
			return e.uncontended(ls, cfg.Pairs)
		},
	}}
	for _, c := range []struct {
		name          string
		size, workers int
	}{{"contended/8", 1, 8}, {"contended/64", 1, 64}, {fmt.Sprintf("semaphore/K%d/%dw", semK, semW), semK, semW}} {
		for _, hold := range holds {
			list = append(list, scenario{
				name: fmt.Sprintf("%s/hold%s", c.name, fmtHold(hold)),
				run: func(e *env, l *lib) (metrics, []float64, error) {
					m, err := e.contended(l, c.size, c.workers, hold, cfg.Dur)
					return m, nil, err
				},
				ok: func(l *lib) bool { return c.size == 1 || l.sem },
			})
		}
	}
	list = append(list,
		scenario{
			name: "handoff",
			run: func(e *env, l *lib) (metrics, []float64, error) {
				s, m, err := e.handoff(l, cfg.Trials)
				if err != nil {
					return nil, nil, err
				}
				c := slices.Clone(s)
				m["p50_us"], m["p99_us"], m["max_us"], m["trials"] = percentile(c, 0.5), percentile(c, 0.99), maxOf(c), float64(len(c))
				return m, s, nil
			},
		},
		scenario{
			name: fmt.Sprintf("waiting/%d", cfg.Waiters),
			run: func(e *env, l *lib) (metrics, []float64, error) {
				m, err := e.waiting(l, cfg.Waiters)
				return m, nil, err
			},
		},
		scenario{
			name: fmt.Sprintf("rate/%dper%s/%dw", rateN, ratePer, rateWorkers),
			run: func(e *env, l *lib) (metrics, []float64, error) {
				m, err := e.rate(cfg.RateDur)
				return m, nil, err
			},
			ok: redsemOnly,
		},
		scenario{
			name: fmt.Sprintf("rate-units/%dper%s/%dw", unitsN, unitsPer, rateWorkers),
			run: func(e *env, l *lib) (metrics, []float64, error) {
				m, err := e.rateUnits(4 * cfg.RateDur)
				return m, nil, err
			},
			ok: redsemOnly,
		},
		scenario{
			name: fmt.Sprintf("rwlock/readers/%dr/%s", rwReaders, fmtHold(rwHold)),
			run: func(e *env, l *lib) (metrics, []float64, error) {
				rwRuns++ // the RWMutex and the semaphore take turns going first
				m, err := e.rwReadersVsSemaphore(l, cfg.Dur, rwRuns)
				return m, nil, err
			},
			ok: redsemOnly,
		},
		scenario{
			name: fmt.Sprintf("rwlock/writer/%dr%s/w%s", rwLoadReaders, fmtHold(rwReadHold), fmtHold(rwWritePeriod)),
			run: func(e *env, l *lib) (metrics, []float64, error) {
				m, err := e.rwWriter(rwWriterWindow * cfg.Dur)
				return m, nil, err
			},
			ok: redsemOnly,
		},
		scenario{
			name: "election",
			run: func(e *env, l *lib) (metrics, []float64, error) {
				m, err := e.election()
				return m, nil, err
			},
			ok: redsemOnly,
		},
		scenario{
			name: fmt.Sprintf("queue/%d/pool%d", cfg.Queue, queuePool),
			run: func(e *env, l *lib) (metrics, []float64, error) {
				m, err := e.queue(l, cfg.Queue, queuePool)
				return m, nil, err
			},
			ok: redsemOnly,
		},
	)
	return list
}

func fmtHold(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

func main() {
	quick := flag.Bool("quick", false, "one short repetition (a smoke test, about 30s); figures are not comparable")
	reps := flag.Int("reps", 0, "repetitions; medians are reported (default 3, 1 with -quick)")
	out := flag.String("out", "results", "directory for latest.json and handoff.svg")
	bin := flag.String("redis-server", "", "redis-server binary (default: /usr/bin/redis-server, else PATH)")
	only := flag.String("only", "", "comma-separated scenario name prefixes to run (default all)")
	libsFlag := flag.String("libs", "", "comma-separated library names to run (default all; redsem always runs)")
	flag.Parse()

	cfg := config{Reps: 3, Pairs: 1000, Dur: time.Second, Trials: 200, Waiters: 1000, Queue: 10000, RateDur: time.Second}
	if *quick {
		cfg = config{Quick: true, Reps: 1, Pairs: 300, Dur: 300 * time.Millisecond, Trials: 60, Waiters: 1000, Queue: 2000, RateDur: time.Second}
	}
	if *reps > 0 {
		cfg.Reps = *reps
	}
	if *bin == "" {
		*bin = "/usr/bin/redis-server"
		if _, err := os.Stat(*bin); err != nil {
			if p, err := exec.LookPath("redis-server"); err == nil {
				*bin = p
			}
		}
	}
	if err := run(cfg, *bin, *out, split(*only), split(*libsFlag)); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func run(cfg config, bin, out string, only, libNames []string) error {
	began := time.Now()
	srv, err := startServer(bin)
	if err != nil {
		return err
	}
	defer srv.close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.close()
		os.Exit(130)
	}()
	e, err := newEnv(srv.Addr)
	if err != nil {
		return err
	}
	defer e.close()

	// The floors that call FCALL need their libraries: loaded once, here,
	// before anything is measured (a Redis before 7.0 runs without them).
	load, lerr := e.loadFunctions()
	if lerr != nil {
		fmt.Fprintf(os.Stderr, "FUNCTION LOAD: %v; the floors that call functions do not run\n", lerr)
	}
	var ls []*lib
	for _, l := range libs() {
		if l.functions && lerr != nil {
			continue
		}
		if len(libNames) == 0 || l.name == "redsem" || slices.Contains(libNames, l.name) {
			ls = append(ls, l)
		}
	}
	var scs []scenario
	for _, sc := range scenarios(cfg) {
		if len(only) == 0 || slices.ContainsFunc(only, func(p string) bool { return strings.HasPrefix(sc.name, p) }) {
			scs = append(scs, sc)
		}
	}

	rep := &report{
		Command:  "cd bench && go run . " + strings.Join(os.Args[1:], " "),
		Started:  began.UTC().Format(time.RFC3339),
		Config:   cfg,
		Machine:  machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), Redis: srv.version(), RedisBin: bin},
		samples:  map[string][]float64{},
		perRep:   map[string]map[string][]metrics{},
		libOrder: ls,
	}
	if lerr == nil {
		rep.FunctionLoad = &load
	}
	rep.Machine.Load = append(rep.Machine.Load, loadavg())
	rep.Machine.Redsem, rep.Machine.Dirty = libraryVersion()
	fmt.Fprintf(os.Stderr, "redis-server %s on %s (pid %d); load %s\n", rep.Machine.Redis, srv.Addr, srv.pid, loadavg())
	for r := range cfg.Reps {
		for _, sc := range scs {
			if sc.all != nil {
				t := time.Now()
				in := slices.DeleteFunc(slices.Clone(ls), func(l *lib) bool { return !sc.takesPart(l) })
				ms, err := sc.all(e, in)
				if err != nil {
					return fmt.Errorf("rep %d, %s: %w", r+1, sc.name, err)
				}
				fmt.Fprintf(os.Stderr, "rep %d  %-28s %-16s %6.2fs\n", r+1, sc.name, "(all)", time.Since(t).Seconds())
				for _, l := range in {
					rep.add(sc.name, l.name, ms[l.name])
				}
				continue
			}
			// Rotate the order of libraries from one repetition to the
			// next, so that no library always runs first.
			for k := range ls {
				l := ls[(k+r)%len(ls)]
				if !sc.takesPart(l) {
					continue
				}
				t := time.Now()
				m, samples, err := sc.run(e, l)
				if err != nil {
					return fmt.Errorf("rep %d, %s, %s: %w", r+1, sc.name, l.name, err)
				}
				fmt.Fprintf(os.Stderr, "rep %d  %-28s %-16s %6.2fs\n", r+1, sc.name, l.name, time.Since(t).Seconds())
				rep.add(sc.name, l.name, m)
				if samples != nil {
					rep.samples[l.name] = append(rep.samples[l.name], samples...)
				}
			}
		}
		rep.Machine.Load = append(rep.Machine.Load, loadavg())
	}
	rep.Elapsed = time.Since(began).Seconds()
	rep.finish(scs)
	rep.print(os.Stdout)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := rep.writeJSON(filepath.Join(out, "latest.json")); err != nil {
		return err
	}
	if len(rep.samples) > 0 {
		if err := os.WriteFile(filepath.Join(out, "handoff.svg"), []byte(cdfSVG(rep.samples, ls)), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s and %s in %.0fs\n", filepath.Join(out, "latest.json"), filepath.Join(out, "handoff.svg"), time.Since(began).Seconds())
	return nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// libraryVersion returns the commit of the redsem checkout in .. and the
// library files (outside bench) that differ from it.
func libraryVersion() (string, []string) {
	out, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown", nil
	}
	commit := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench").Output()
	if err != nil {
		return commit, nil
	}
	var dirty []string
	for _, line := range strings.Split(strings.TrimSpace(string(st)), "\n") {
		if f := strings.TrimSpace(line); len(f) > 3 {
			dirty = append(dirty, strings.TrimSpace(f[2:]))
		}
	}
	return commit, dirty
}
