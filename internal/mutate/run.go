package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The kill subset: stages run in order, and the first test that fails
// (again, when run alone) kills the mutant. The tests run without -race,
// on miniredis only (redis-server is kept off PATH): what fails here fails
// in the README's test command too. A survivor is then confirmed against
// its packages' full tests, redis-server included.
type stage struct {
	name      string
	pkg       string // the package's directory
	run, skip string // -test.run and -test.skip
	invalid   bool   // a failure makes the mutant invalid, not killed
	full      bool   // the confirmation: every test, every backend
	shards    int    // processes at once (see test)
}

// slowTests take seconds each; they run after the others.
const slowTests = "againstHungServer|staleGrantReleaseDoesNotOutliveContext|ACLCommands_userRunsEveryOperation|" +
	"partialLeasesOutliveTheirBackstop|shorterTTLWithAWaiterBlocked|shortReadTimeoutPool|deadCollectorHandsOn|" +
	"WrongType_writesNothing|autoHoldsUntilRelease|cancellationStorm"

// stages returns the kill subset for a mutant of file, or its
// confirmation.
func stages(file string, full bool) []stage {
	base := filepath.Base(file)
	var pkgs []string // the packages whose tests run the file
	switch {
	case strings.HasPrefix(base, "rate_"):
		// The rate explorer and its regression cases live in the root
		// package.
		pkgs = []string{"internal/engine", "rate", "."}
	case base == "base.lua" || base == "driver.go":
		pkgs = []string{"internal/engine", ".", "rate"}
	case strings.HasSuffix(base, ".lua"):
		pkgs = []string{"internal/engine", "."}
	default:
		pkgs = []string{"."}
	}
	var out []stage
	for _, p := range pkgs {
		switch {
		case full:
			out = append(out, stage{name: "full " + p, pkg: p, full: true, shards: 2})
		case p == "internal/engine" && strings.HasSuffix(base, ".lua"):
			out = append(out, stage{name: "shape", pkg: p, run: "^TestLuaShape$", invalid: true},
				stage{name: "engine", pkg: p, skip: "^TestLuaShape$"})
		case p == "." && strings.HasPrefix(base, "rate_"):
			out = append(out, stage{name: "explore", pkg: p, run: "^TestExplore_rate"})
		case p == ".":
			out = append(out, stage{name: "root", pkg: p, skip: "^(TestExplore|TestDocs)|" + slowTests, shards: 4},
				stage{name: "root-slow", pkg: p, run: slowTests, shards: 10},
				stage{name: "explore", pkg: p, run: "^TestExplore"})
		default:
			out = append(out, stage{name: filepath.Base(p), pkg: p, shards: 3})
		}
	}
	return out
}

const (
	stageTimeout = 8 * time.Minute  // a whole stage
	quietTimeout = 60 * time.Second // no line of output: a hang
)

type result struct {
	m      mutant
	status string // killed, timeout (counts as killed), survived, invalid, unfinished
	test   string // the killing test, or why invalid
	stage  string
	took   time.Duration
}

type harness struct {
	jobs     int
	baseline bool // first run the unchanged module through every stage
	verbose  bool
	deadline time.Time // start no mutant after it (zero: none)
	noPath   string    // an empty directory: PATH in the kill subset
}

// run runs every mutant, jobs at a time, and returns their results in order.
func (h *harness) run(ms []mutant) ([]result, error) {
	tmp, err := os.MkdirTemp("", "redsem-mutate-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	h.noPath = filepath.Join(tmp, "empty")
	if err := os.Mkdir(h.noPath, 0o755); err != nil {
		return nil, err
	}
	copies := make(chan string, h.jobs)
	for i := 0; i < h.jobs; i++ {
		dir := filepath.Join(tmp, fmt.Sprint(i))
		if err := copyTree(".", dir); err != nil {
			return nil, err
		}
		copies <- dir
	}
	if h.baseline {
		dir := <-copies
		// base.lua's stages are every package's.
		r := h.one(dir, mutant{ID: "baseline", File: "internal/engine/lua/base.lua"}, false)
		if r.status != "survived" {
			return nil, fmt.Errorf("the unchanged module fails its kill subset (%s %s: %s): fix that first", r.stage, r.status, r.test)
		}
		copies <- dir
		fmt.Println("baseline: the unchanged module passes every stage")
	}
	results := make([]result, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		dir := <-copies
		if !h.deadline.IsZero() && time.Now().After(h.deadline) {
			results[i] = result{m: m, status: "unfinished"}
			copies <- dir
			continue
		}
		wg.Add(1)
		go func(i int, m mutant, dir string) {
			defer wg.Done()
			r := h.one(dir, m, true)
			results[i] = r
			fmt.Printf("%-56s %-9s %-10s %s (%.0fs)\n", r.m.ID, r.status, r.stage, r.test, r.took.Seconds())
			copies <- dir
		}(i, m, dir)
	}
	wg.Wait()
	return results, nil
}

// one applies m in the copy dir, builds its packages' tests, runs the kill
// subset (then, for a survivor, the confirmation), and restores the file.
func (h *harness) one(dir string, m mutant, confirm bool) result {
	start := time.Now()
	r := h.apply(dir, m, func(bin string) result {
		r := h.stages(dir, bin, stages(m.File, false))
		if r.status == "survived" && confirm {
			if r = h.stages(dir, bin, stages(m.File, true)); r.status == "survived" {
				r.stage = "full"
			}
		}
		return r
	})
	r.m, r.took = m, time.Since(start)
	return r
}

func (h *harness) apply(dir string, m mutant, test func(bin string) result) result {
	orig, err := os.ReadFile(m.File)
	if err != nil {
		return result{status: "invalid", test: err.Error()}
	}
	path := filepath.Join(dir, m.File)
	src := string(orig)
	if m.End > 0 {
		src = src[:m.Start] + m.New + src[m.End:]
	}
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		return result{status: "invalid", test: err.Error()}
	}
	defer os.WriteFile(path, orig, 0o644)
	if filepath.Dir(m.File) == luaParts {
		// Redis runs scripts/, resolved from the parts: resolve the
		// mutant's, and put the module's own back after.
		defer copyTree(luaScripts, dir)
		if out, err := generate(dir); err != nil {
			return result{status: "invalid", stage: "generate", test: firstLine(out)}
		}
	}
	bin := filepath.Join(dir, ".mutate-bin") + string(filepath.Separator)
	os.RemoveAll(bin)
	args := []string{"test", "-c", "-o", bin}
	seen := map[string]bool{}
	for _, st := range stages(m.File, true) {
		if !seen[st.pkg] {
			seen[st.pkg] = true
			args = append(args, "./"+st.pkg)
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return result{status: "invalid", stage: "build", test: firstLine(string(out))}
	}
	return test(bin)
}

// Where the engine's scripts are written in parts, and resolved from them.
const (
	luaParts   = "internal/engine/lua"
	luaScripts = "internal/engine/scripts"
)

// generate resolves the scripts of the module at dir from their parts (go
// generate ./internal/engine).
func generate(dir string) (string, error) {
	cmd := exec.Command("go", "test", "-count=1", "-run", "^TestScriptsGenerated$", "./internal/engine", "-args", "-write")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// binName is the test binary go test -c -o dir/ writes for package pkg.
func binName(pkg string) string {
	if pkg == "." {
		return "redsem.test"
	}
	return filepath.Base(pkg) + ".test"
}

// luaSyntax is how miniredis (gopher-lua) reports a script that does not
// compile; it says "Error compiling script" of errors at run time too.
var luaSyntax = regexp.MustCompile(`near '[^']*':\s+syntax error`)

// stages runs sts in order; the first failure decides.
func (h *harness) stages(dir, bin string, sts []stage) result {
	for _, st := range sts {
		skip := st.skip
		for attempt := 0; attempt < 3; attempt++ {
			failed, out, timedOut := h.test(dir, bin, st, st.run, skip)
			if timedOut {
				return result{status: "timeout", stage: st.name, test: failed}
			}
			if failed == "" {
				break
			}
			if luaSyntax.MatchString(out) || st.invalid {
				return result{status: "invalid", stage: st.name, test: failed}
			}
			// A test that fails again alone killed the mutant; one that
			// passes alone was flaky: the stage runs again without it.
			if again, _, to := h.exec(context.Background(), dir, bin, st, "^"+regexp.QuoteMeta(failed)+"$", ""); again != "" || to {
				if h.verbose {
					fmt.Printf("--- %s: %s\n%s\n", st.name, failed, tail(out, 30))
				}
				return result{status: "killed", stage: st.name, test: failed}
			}
			fmt.Printf("flaky: %s passed alone (%s)\n", failed, st.name)
			skip = strings.TrimPrefix(skip+"|^"+regexp.QuoteMeta(failed)+"$", "|")
		}
	}
	return result{status: "survived"}
}

var failLine = regexp.MustCompile(`^--- FAIL: (\S+)`)

// test runs the stage's tests matching run and not skip, split over
// st.shards processes at once (most tests sleep more than they compute),
// and returns the first top-level test that failed ("" when all passed),
// its output, and whether a process hung or ran out of time.
func (h *harness) test(dir, bin string, st stage, run, skip string) (failed, out string, timedOut bool) {
	groups := []string{run}
	if st.shards > 1 {
		groups = shards(filepath.Join(bin, binName(st.pkg)), st.shards, run, skip)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		failed, out string
		timedOut    bool
	}
	done := make(chan outcome, len(groups))
	for _, g := range groups {
		go func(g string) {
			f, o, t := h.exec(ctx, dir, bin, st, g, skip)
			done <- outcome{f, o, t}
		}(g)
	}
	for range groups {
		o := <-done
		if (o.failed != "" || o.timedOut) && failed == "" && !timedOut {
			failed, out, timedOut = o.failed, o.out, o.timedOut
			cancel() // the other shards' results no longer matter
		}
	}
	return failed, out, timedOut
}

// shards splits the tests of the binary bin matching run and not skip into
// n -test.run patterns.
func shards(bin string, n int, run, skip string) []string {
	if run == "" {
		run = "."
	}
	b, err := exec.Command(bin, "-test.list", run).Output()
	if err != nil {
		return []string{run} // the run itself will say what is wrong
	}
	skipRE := regexp.MustCompile(skip)
	groups := make([][]string, n)
	i := 0
	for _, name := range strings.Fields(string(b)) {
		if strings.HasPrefix(name, "Benchmark") || skip != "" && skipRE.MatchString(name) {
			continue
		}
		groups[i%n] = append(groups[i%n], regexp.QuoteMeta(name))
		i++
	}
	var out []string
	for _, g := range groups {
		if len(g) > 0 {
			out = append(out, "^("+strings.Join(g, "|")+")$")
		}
	}
	return out
}

// exec runs one process of the stage's tests; see test.
func (h *harness) exec(parent context.Context, dir, bin string, st stage, run, skip string) (failed, out string, timedOut bool) {
	ctx, cancel := context.WithTimeout(parent, stageTimeout)
	defer cancel()
	args := []string{"-test.v", "-test.count=1", "-test.timeout", stageTimeout.String()}
	if !st.full {
		args = append(args, "-test.failfast", "-test.parallel", "8")
	}
	if run != "" {
		args = append(args, "-test.run", run)
	}
	if skip != "" {
		args = append(args, "-test.skip", skip)
	}
	// Memory is capped: a mutant's loop may grow a table without end.
	cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `ulimit -v 6000000; exec "$0" "$@"`,
		filepath.Join(bin, binName(st.pkg))}, args...)...)
	cmd.Dir = filepath.Join(dir, st.pkg)
	cmd.Env = os.Environ()
	if !st.full {
		cmd.Env = append(cmd.Env, "REDSEM_BACKENDS=miniredis", "PATH="+h.noPath)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return "start: " + err.Error(), "", false
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	var b strings.Builder
	quiet := time.AfterFunc(quietTimeout, cancel)
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		quiet.Reset(quietTimeout)
		line := sc.Text()
		b.WriteString(line + "\n")
		if m := failLine.FindStringSubmatch(line); m != nil && failed == "" {
			failed = m[1]
		}
	}
	io.Copy(io.Discard, pr)
	err := <-done
	quiet.Stop()
	out = b.String()
	if parent.Err() != nil {
		return "", out, false // cancelled: another shard decided
	}
	if ctx.Err() != nil || strings.Contains(out, "panic: test timed out") {
		if failed == "" {
			failed = runningTest(out)
		}
		return failed, out, true
	}
	if err != nil && failed == "" {
		failed = "(exit: " + firstLine(tail(out, 5)) + ")"
	}
	return failed, out, false
}

// runningTest is the last test an output started and did not finish.
func runningTest(out string) string {
	last := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "=== RUN   ") && !strings.Contains(line, "/") {
			last = strings.TrimPrefix(line, "=== RUN   ")
		}
	}
	return last
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// copyTree copies the module at src (without .git) to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dst, path)
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
}
