package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

type machine struct {
	CPUs       int      `json:"cpus"`
	GOMAXPROCS int      `json:"gomaxprocs"`
	Go         string   `json:"go"`
	Redis      string   `json:"redis_version"`
	RedisBin   string   `json:"redis_server"`
	Load       []string `json:"loadavg"` // /proc/loadavg at the start and after each repetition
	// Redsem is the commit of the library under test (bench replaces the
	// module with ../), and Dirty lists its files that differ from it.
	Redsem string   `json:"redsem_commit"`
	Dirty  []string `json:"redsem_uncommitted,omitempty"`
}

// target is one of the targets: redsem's figure in one scenario
// over the raw floor's in the same run, or (Absolute) redsem's figure
// itself, held against a limit.
type target struct {
	Target   string `json:"target"`
	Scenario string `json:"scenario"`
	Metric   string `json:"metric"`
	Redsem   jfloat `json:"redsem"`
	Floor    jfloat `json:"floor"`
	FloorLib string `json:"floor_lib"`
	Ratio    jfloat `json:"ratio"` // redsem / floor
	// Absolute: the limit holds redsem's figure, not the ratio.
	Absolute bool    `json:"absolute,omitempty"`
	Op       string  `json:"op"` // ">=" or "<="
	Limit    float64 `json:"limit"`
	// Unit of an absolute limit (" µs", or none for a count).
	Unit string `json:"unit,omitempty"`
	// Verdict is PASS, MISS, or n/a when the run did not measure both.
	Verdict string `json:"verdict"`
	// Floors: each lease floor's figure over FloorLib's (its own figure
	// when Absolute), held against the same limit: what a lock that keeps
	// that floor's promises and no more would score.
	Floors map[string]jfloat `json:"lease_floors,omitempty"`
}

// leaseFloors are the floors that keep one promise more than floor:blpop
// (libs.go), shown beside every target.
var leaseFloors = []string{"floor:lease", "floor:register", "floor:queued", "floor:onerecord", "floor:onerecord-fcall", "floor:held", "floor:kept", "floor:noscript", "floor:pipeline"}

// report gathers every run's metrics and turns them into medians, ratios
// and target verdicts.
type report struct {
	Command  string    `json:"command"`
	Started  string    `json:"started"`
	Elapsed  float64   `json:"elapsed_s"`
	Config   config    `json:"config"`
	Machine  machine   `json:"machine"`
	Results  []scenOut `json:"scenarios"`
	Targets  []target  `json:"targets"`
	samples  map[string][]float64
	perRep   map[string]map[string][]metrics
	libOrder []*lib

	// FunctionLoad: the FUNCTION LOAD REPLACE of the floors' libraries at
	// the start (nil: not loaded).
	FunctionLoad *fnLoad `json:"function_load,omitempty"`
}

type scenOut struct {
	Name string `json:"name"`
	// Libs: per library, the median over repetitions of each figure and the
	// figures of every repetition.
	Libs map[string]libOut `json:"libs"`
	// Ratios: per figure, redsem's median divided by each other library's.
	Ratios map[string]map[string]jfloat `json:"ratios_redsem_over"`
}

type libOut struct {
	Median map[string]jfloat   `json:"median"`
	Reps   []map[string]jfloat `json:"reps"`
}

// jfloat is a float64 that encodes NaN and ±Inf as null.
type jfloat float64

func (f jfloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(math.Round(v*1000) / 1000)
}

func jmap(m metrics) map[string]jfloat {
	out := make(map[string]jfloat, len(m))
	for k, v := range m {
		out[k] = jfloat(v)
	}
	return out
}

func (r *report) add(sc, lib string, m metrics) {
	if r.perRep[sc] == nil {
		r.perRep[sc] = map[string][]metrics{}
	}
	r.perRep[sc][lib] = append(r.perRep[sc][lib], m)
}

// med returns the median over repetitions of one figure; NaN when absent.
func (r *report) med(sc, lib, metric string) float64 {
	var xs []float64
	for _, m := range r.perRep[sc][lib] {
		if v, ok := m[metric]; ok {
			xs = append(xs, v)
		}
	}
	return median(xs)
}

func (r *report) finish(scs []scenario) {
	for _, sc := range scs {
		out := scenOut{Name: sc.name, Libs: map[string]libOut{}, Ratios: map[string]map[string]jfloat{}}
		for lib, reps := range r.perRep[sc.name] {
			lo := libOut{Median: map[string]jfloat{}}
			for _, m := range reps {
				lo.Reps = append(lo.Reps, jmap(m))
				for k := range m {
					lo.Median[k] = jfloat(r.med(sc.name, lib, k))
				}
			}
			out.Libs[lib] = lo
		}
		if rs, ok := r.perRep[sc.name]["redsem"]; ok && len(rs) > 0 {
			for k := range rs[0] {
				if strings.HasPrefix(k, cmdCalls) || strings.HasPrefix(k, cmdUs) {
					continue
				}
				for lib := range r.perRep[sc.name] {
					if lib == "redsem" {
						continue
					}
					if out.Ratios[k] == nil {
						out.Ratios[k] = map[string]jfloat{}
					}
					out.Ratios[k][lib] = jfloat(r.med(sc.name, "redsem", k) / r.med(sc.name, lib, k))
				}
			}
		}
		r.Results = append(r.Results, out)
	}
	r.targets()
}

// targets checks the targets, each against a floor measured in the
// same run (medians), but the Redis time of a pair, whose limit is in µs.
func (r *report) targets() {
	// check holds redsem's figure of metric in sc (label) against limit
	// times floor's, or, with no floor, against limit itself in unit.
	check := func(sc, metric, label, floor, op string, limit float64, unit string) {
		t := target{Scenario: sc, Metric: metric, FloorLib: floor, Op: op, Limit: limit, Absolute: floor == "",
			Redsem: jfloat(r.med(sc, "redsem", metric)), Floors: map[string]jfloat{}}
		t.Target = fmt.Sprintf("%s: %s %s %gx %s", sc, label, op, limit, floor)
		base := 1.0
		if t.Absolute {
			t.Target = fmt.Sprintf("%s: %s %s %g%s (absolute)", sc, label, op, limit, unit)
			t.FloorLib = "floor:blpop"
		} else {
			base = r.med(sc, floor, metric)
		}
		t.Unit = unit
		t.Floor = jfloat(r.med(sc, t.FloorLib, metric))
		t.Ratio = t.Redsem / t.Floor
		t.Verdict = verdict(float64(t.Redsem)/base, op, limit)
		for _, f := range leaseFloors {
			if v := r.med(sc, f, metric) / base; !math.IsNaN(v) {
				t.Floors[f] = jfloat(v)
			}
		}
		r.Targets = append(r.Targets, t)
	}
	sem := fmt.Sprintf("semaphore/K%d/%dw", semK, semW)
	// The handoff chain: one pass, and the rates where it is the work
	// beside a hold of 1 ms or alone.
	check("handoff", "p50_us", "p50", "floor:blpop", "<=", 1.5, "")
	check("contended/8/hold1ms", "acq_per_s", "acq/s", "floor:blpop", ">=", 0.95, "")
	check("contended/64/hold1ms", "acq_per_s", "acq/s", "floor:blpop", ">=", 0.95, "")
	check(sem+"/hold1ms", "acq_per_s", "acq/s", "floor:blpop", ">=", 0.95, "")
	check("contended/8/hold0", "acq_per_s", "acq/s", "floor:blpop", ">=", 0.6, "")
	check("contended/64/hold0", "acq_per_s", "acq/s", "floor:blpop", ">=", 0.6, "")
	check(sem+"/hold0", "acq_per_s", "acq/s", "floor:blpop", ">=", 0.4, "")
	// An uncontended pair: its latency, and its Redis time (commandstats).
	check("uncontended", "p50_us", "p50", "floor:ping", "<=", 1.25, "")
	check("uncontended", "server_us", "Redis µs/pair", "", "<=", 15, " µs")
	// Protocol v2's: a contended acquisition in one round trip and few
	// commands, a handoff nearer the raw pass,
	check("contended/8/hold1ms", "roundtrips_acq_rel", "RTs acq+rel/pair (v2)", "", "<=", 2, "")
	check("contended/8/hold1ms", "redis_cmds", "Redis cmds/pair (v2)", "", "<=", 10, "")
	check("handoff", "p50_us", "p50 (v2)", "floor:blpop", "<=", 1.4, "")
	// and an uncontended pair as fast as the lock a user would pick instead.
	check("uncontended", "p50_us", "p50 (v2)", "redsync:default", "<=", 1.1, "")
}

// verdict is PASS or MISS for v against op limit, n/a when v is not a number.
func verdict(v float64, op string, limit float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "n/a"
	case op == ">=" && v >= limit, op == "<=" && v <= limit:
		return "PASS"
	}
	return "MISS"
}

// column is one figure of a table.
type column struct {
	metric, head string
	scale        float64 // divide by this before printing
	prec         int
}

func columnsFor(sc string) (cols []column, ratio string) {
	switch {
	case sc == "uncontended":
		return []column{{"pairs_per_s", "pairs/s", 1, 0}, {"p50_us", "p50 µs", 1, 0}, {"p99_us", "p99 µs", 1, 0},
			{"roundtrips", "RTs/pair", 1, 2}, {"roundtrips_acq", "RTs acq", 1, 2}, {"roundtrips_rel", "RTs rel", 1, 2},
			{"sent_cmds", "cmds sent/pair", 1, 1}, {"redis_cmds", "Redis cmds/pair", 1, 1},
			{"script_us", "Lua µs/pair", 1, 1}, {"server_us", "Redis µs/pair", 1, 1}, {"cpu_us", "Redis CPU µs/pair", 1, 1}}, "p50_us"
	case strings.HasPrefix(sc, "contended/"):
		return []column{{"acq_per_s", "acq/s", 1, 0}, {"wait_p50_us", "wait p50 ms", 1000, 2}, {"wait_p99_us", "wait p99 ms", 1000, 1},
			{"wait_max_us", "wait max ms", 1000, 0}, {"hold_p50_us", "hold p50 µs", 1, 0}, {"jain", "Jain", 1, 3}, {"starved", "starved", 1, 0},
			{"roundtrips", "RTs/pair", 1, 2}, {"roundtrips_acq", "RTs acq", 1, 2}, {"roundtrips_rel", "RTs rel", 1, 2},
			{"sent_cmds", "cmds sent/pair", 1, 1}, {"redis_cmds", "Redis cmds/pair", 1, 1}, {"server_us", "Redis µs/pair", 1, 1}, {"cpu_us", "Redis CPU µs/pair", 1, 1}}, "acq_per_s"
	case sc == "handoff":
		return []column{{"p50_us", "p50 µs", 1, 0}, {"p99_us", "p99 µs", 1, 0}, {"max_us", "max µs", 1, 0}, {"trials", "trials/rep", 1, 0},
			{"roundtrips_acq", "RTs waiter acq", 1, 2}, {"redis_cmds", "Redis cmds/pair", 1, 1}, {"server_us", "Redis µs/pair", 1, 1}, {"cpu_us", "Redis CPU µs/pair", 1, 1}}, "p50_us"
	case strings.HasPrefix(sc, "semaphore/"):
		return []column{{"acq_per_s", "acq/s", 1, 0}, {"utilisation", "utilisation", 1, 3}, {"max_holders", "max holders", 1, 0},
			{"wait_p50_us", "wait p50 ms", 1000, 2}, {"wait_p99_us", "wait p99 ms", 1000, 2}, {"hold_p50_us", "hold p50 µs", 1, 0}, {"jain", "Jain", 1, 3},
			{"roundtrips", "RTs/pair", 1, 2}, {"roundtrips_acq", "RTs acq", 1, 2}, {"redis_cmds", "Redis cmds/pair", 1, 1},
			{"server_us", "Redis µs/pair", 1, 1}, {"cpu_us", "Redis CPU µs/pair", 1, 1}}, "acq_per_s"
	case strings.HasPrefix(sc, "waiting/"):
		return []column{{"connections", "Redis conns", 1, 0}, {"client_mem_kib", "client KiB", 1, 0}, {"mem_per_waiter_b", "B/waiter", 1, 0},
			{"goroutines", "goroutines", 1, 0}, {"redis_cmds_per_s", "Redis cmds/s while waiting", 1, 0},
			{"server_us_per_s", "Redis µs/s while waiting", 1, 0},
			{"cpu_us_per_s", "Redis CPU µs/s while waiting", 1, 0}}, "connections"
	case strings.HasPrefix(sc, "rwlock/readers/"):
		return []column{{"acq_per_s", "RLock acq/s", 1, 0}, {"sem_acq_per_s", "semaphore acq/s", 1, 0},
			{"ratio_acq_per_s", "RLock/semaphore", 1, 3}, {"wait_p50_us", "RLock wait p50 ms", 1000, 2},
			{"wait_p99_us", "RLock wait p99 ms", 1000, 2}, {"sem_wait_p50_us", "sem wait p50 ms", 1000, 2},
			{"sem_wait_p99_us", "sem wait p99 ms", 1000, 2}, {"max_holders", "RLock max holders", 1, 0},
			{"roundtrips", "RLock RTs/pair", 1, 2}, {"sem_roundtrips", "sem RTs/pair", 1, 2},
			{"redis_cmds", "RLock Redis cmds/pair", 1, 1}, {"sem_redis_cmds", "sem Redis cmds/pair", 1, 1},
			{"server_us", "RLock Redis µs/pair", 1, 1}, {"sem_server_us", "sem Redis µs/pair", 1, 1},
			{"cpu_us", "RLock Redis CPU µs/pair", 1, 1}, {"sem_cpu_us", "sem Redis CPU µs/pair", 1, 1}}, ""
	case strings.HasPrefix(sc, "rwlock/writer/"):
		return []column{{"writes", "writes", 1, 0}, {"write_wait_p50_us", "write wait p50 ms", 1000, 2},
			{"write_wait_p99_us", "write wait p99 ms", 1000, 2}, {"write_wait_max_us", "write wait max ms", 1000, 2},
			{"reads_per_s", "reads/s", 1, 0}, {"read_wait_p50_us", "read wait p50 ms", 1000, 2},
			{"read_wait_p99_us", "read wait p99 ms", 1000, 2}, {"roundtrips", "RTs/pair", 1, 2},
			{"redis_cmds", "Redis cmds/pair", 1, 1}, {"server_us", "Redis µs/pair", 1, 1}, {"cpu_us", "Redis CPU µs/pair", 1, 1}}, ""
	case strings.HasPrefix(sc, "rate-units/"):
		return []column{{"configured_units_per_s", "configured units/s", 1, 0}, {"achieved_units_per_s", "achieved units/s", 1, 0},
			{"achieved_ratio", "achieved/configured", 1, 3}, {"worst_window_units", "most units in a window", 1, 0},
			{"starts", "starts", 1, 0}, {"wait_p50_us", "wait p50 ms", 1000, 1}, {"wait_p99_us", "wait p99 ms", 1000, 0},
			{"wait_p99_large_us", "wait p99 ms, 64 units", 1000, 0}}, ""
	case strings.HasPrefix(sc, "rate/"):
		return []column{{"configured_per_s", "configured/s", 1, 1}, {"achieved_per_s", "achieved/s", 1, 1},
			{"worst_window", "most starts in a window", 1, 0}, {"gap_p50_us", "gap p50 ms", 1000, 2}, {"gap_p99_us", "gap p99 ms", 1000, 1},
			{"fw_achieved_per_s", "fixed window: achieved/s", 1, 1}, {"fw_worst_window", "fixed window: most in a window", 1, 0},
			{"fw_gap_p99_us", "fixed window: gap p99 ms", 1000, 1}}, ""
	case sc == "election":
		return []column{{"resign_p50_us", "resign → observer p50 µs", 1, 0}, {"resign_p99_us", "resign → observer p99 µs", 1, 0},
			{"resign_max_us", "resign → observer max µs", 1, 0}, {"crash_lag_p50_ms", "crash: told after the lease deadline p50 ms", 1, 0},
			{"crash_lag_max_ms", "… max ms", 1, 0}, {"crash_notice_max_ms", "crash → observer max ms", 1, 0}, {"ttl_ms", "TTL ms", 1, 0}}, ""
	case strings.HasPrefix(sc, "queue/"):
		return []column{{"connections", "Redis conns", 1, 0}, {"mem_per_waiter_b", "B/waiter", 1, 0},
			{"redis_cmds_per_s", "Redis cmds/s while waiting", 1, 0}, {"drain_s", "drain s", 1, 2}, {"acq_per_s", "acq/s draining", 1, 0},
			{"roundtrips", "RTs/pair draining", 1, 2}, {"redis_cmds", "Redis cmds/pair draining", 1, 1},
			{"server_us", "Redis µs/pair draining", 1, 1}, {"cpu_us", "Redis CPU µs/pair draining", 1, 1}}, ""
	}
	return nil, ""
}

// print writes the tables in Markdown: one per scenario, libraries as rows,
// medians over repetitions, and redsem's figure divided by the row's.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "redsem bench: %d repetition(s), medians; redis %s, %d CPUs, %s; load %s\n",
		r.Config.Reps, r.Machine.Redis, r.Machine.CPUs, r.Machine.Go, strings.Join(r.Machine.Load, " → "))
	fmt.Fprintf(w, "command: %s (%.0fs)\n", r.Command, r.Elapsed)
	dirty := ""
	if len(r.Machine.Dirty) > 0 {
		dirty = fmt.Sprintf(" plus uncommitted changes to %s", strings.Join(r.Machine.Dirty, ", "))
	}
	fmt.Fprintf(w, "redsem at %s%s\n", r.Machine.Redsem, dirty)
	if f := r.FunctionLoad; f != nil {
		fmt.Fprintf(w, "Function libraries of the floors: %d FUNCTION LOAD REPLACE at the start, %d µs of Redis time\n", f.Calls, f.Usec)
	}
	for _, sc := range r.Results {
		cols, ratio := columnsFor(sc.Name)
		fmt.Fprintf(w, "\n### %s\n\n| library |", sc.Name)
		for _, c := range cols {
			fmt.Fprintf(w, " %s |", c.head)
		}
		if ratio != "" {
			fmt.Fprintf(w, " redsem/this (%s) |", ratio)
		}
		fmt.Fprint(w, "\n|---|")
		for range cols {
			fmt.Fprint(w, "--:|")
		}
		if ratio != "" {
			fmt.Fprint(w, "--:|")
		}
		fmt.Fprintln(w)
		for _, l := range r.libOrder {
			if _, ok := r.perRep[sc.Name][l.name]; !ok {
				continue
			}
			fmt.Fprintf(w, "| %s |", l.name)
			for _, c := range cols {
				fmt.Fprintf(w, " %s |", fmtNum(r.med(sc.Name, l.name, c.metric)/c.scale, c.prec))
			}
			switch {
			case ratio == "":
				fmt.Fprintln(w)
			case l.name == "redsem":
				fmt.Fprintln(w, " — |")
			default:
				fmt.Fprintf(w, " %s |\n", fmtNum(r.med(sc.Name, "redsem", ratio)/r.med(sc.Name, l.name, ratio), 3))
			}
		}
		if strings.HasPrefix(sc.Name, "semaphore/") {
			fmt.Fprintln(w, "\nredsync, redislock and rueidislock have no semaphores: n/a.")
		}
		if sc.Name == "uncontended" {
			r.printCommands(w, sc.Name, "redsem")
		}
	}
	fmt.Fprintf(w, "\n### targets\n\nEach against the floor measured in this run (medians over repetitions); the lease floors' "+
		"columns hold their figure over the same floor's (their own for the absolute target) against the same limit.\n\n")
	fmt.Fprintf(w, "| target | redsem | floor | redsem/floor | limit | verdict | %s |\n|---|--:|--:|--:|--:|---|%s\n",
		strings.Join(leaseFloors, " | "), strings.Repeat("--:|", len(leaseFloors)))
	for _, t := range r.Targets {
		ratio, limit := fmtNum(float64(t.Ratio), 3), fmt.Sprintf("%s %.2f", t.Op, t.Limit)
		if t.Absolute {
			ratio, limit = "—", fmt.Sprintf("%s %g%s", t.Op, t.Limit, t.Unit)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |", t.Target, fmtNum(float64(t.Redsem), 1), fmtNum(float64(t.Floor), 1),
			ratio, limit, t.Verdict)
		for _, f := range leaseFloors {
			v, ok := t.Floors[f]
			if !ok {
				v = jfloat(math.NaN())
			}
			fmt.Fprintf(w, " %s %s |", fmtNum(float64(v), 3), verdict(float64(v), t.Op, t.Limit))
		}
		fmt.Fprintln(w)
	}
}

// printCommands writes where the Redis server time of lib's pairs in
// scenario sc goes, command by command (INFO commandstats): each script
// command's time includes that of the commands it ran, so the script's own
// part (building KEYS and ARGV, the Lua interpreter, the reply) is its time
// less theirs.
func (r *report) printCommands(w io.Writer, sc, lib string) {
	reps := r.perRep[sc][lib]
	if len(reps) == 0 {
		return
	}
	var names []string
	for k := range reps[0] {
		if name, ok := strings.CutPrefix(k, cmdCalls); ok {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Compare(r.med(sc, lib, cmdUs+b), r.med(sc, lib, cmdUs+a))
	})
	var scriptUs, innerUs, innerCalls float64
	for _, n := range names {
		if isScript(n) {
			scriptUs += r.med(sc, lib, cmdUs+n)
		} else {
			innerUs += r.med(sc, lib, cmdUs+n)
			innerCalls += r.med(sc, lib, cmdCalls+n)
		}
	}
	fmt.Fprintf(w, "\nWhere the Redis time of a %s pair goes (INFO commandstats, per pair):\n\n", lib)
	fmt.Fprintf(w, "| command | calls/pair | µs/pair | µs/call |\n|---|--:|--:|--:|\n")
	for _, n := range names {
		c, u := r.med(sc, lib, cmdCalls+n), r.med(sc, lib, cmdUs+n)
		label := n
		if isScript(n) {
			label = strings.ToUpper(n) + " (its commands included)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", label, fmtNum(c, 2), fmtNum(u, 1), fmtNum(u/c, 2))
	}
	if scriptUs > 0 {
		fmt.Fprintf(w, "| inner commands together | %s | %s | %s |\n", fmtNum(innerCalls, 2), fmtNum(innerUs, 1), fmtNum(innerUs/innerCalls, 2))
		fmt.Fprintf(w, "| scripts less their commands | | %s | |\n", fmtNum(scriptUs-innerUs, 1))
	}
}

func fmtNum(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func (r *report) writeJSON(path string) error {
	type handoffOut struct {
		Lib     string   `json:"lib"`
		Samples []jfloat `json:"samples_us"`
	}
	var hs []handoffOut
	for _, l := range r.libOrder {
		if s, ok := r.samples[l.name]; ok {
			s = slices.Clone(s)
			slices.Sort(s)
			js := make([]jfloat, len(s))
			for i, v := range s {
				js[i] = jfloat(v)
			}
			hs = append(hs, handoffOut{l.name, js})
		}
	}
	b, err := json.MarshalIndent(struct {
		*report
		Written string       `json:"written"`
		Handoff []handoffOut `json:"handoff_samples"`
	}{r, time.Now().UTC().Format(time.RFC3339), hs}, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
