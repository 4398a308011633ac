package faults

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// workerBin, rateWorkerBin and electWorkerBin are the worker programs
// (semaphore, rate gate, election), built once by TestMain.
var workerBin, rateWorkerBin, electWorkerBin string

func TestMain(m *testing.M) {
	os.Unsetenv("REDIS_URL")
	dir, err := os.MkdirTemp("", "redsem-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workerBin = filepath.Join(dir, "worker")
	rateWorkerBin = filepath.Join(dir, "rateworker")
	electWorkerBin = filepath.Join(dir, "electworker")
	goBin := goCommand()
	for bin, pkg := range map[string]string{workerBin: "worker", rateWorkerBin: "rateworker", electWorkerBin: "electworker"} {
		cmd := exec.Command(goBin, "build", "-o", bin, "github.com/redsem/redsem/internal/faults/"+pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building the %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	// The tests mostly wait on their worker processes and servers: about
	// 30 s of CPU in a 38 s run on 2 cores with 12 at once (55 s with 6,
	// 110 s at the default, GOMAXPROCS).
	redistest.MoreParallel(12)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// goCommand is the go command that runs this test: on PATH, or under GOROOT.
func goCommand() string {
	if _, err := exec.LookPath("go"); err != nil {
		return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	return "go"
}

// soak reports whether REDSEM_SOAK=1 asks for long runs.
func soak() bool { return os.Getenv("REDSEM_SOAK") == "1" }

// scaled returns d, or d*k under REDSEM_SOAK=1.
func scaled(d time.Duration, k int) time.Duration {
	if soak() {
		return d * time.Duration(k)
	}
	return d
}

// proc is one worker process.
type proc struct {
	id     int
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
	err    error
	killed bool // by the test
	start  time.Time
	bin    string // the program it runs
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill9 sends SIGKILL to the worker and waits for it.
func (p *proc) kill9() {
	if p.exited() {
		return
	}
	p.killed = true
	_ = syscall.Kill(p.pid(), syscall.SIGKILL)
	<-p.done
}

// wait waits for the worker to exit by itself, killing it after timeout.
func (p *proc) wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		p.kill9()
		return false
	}
}

func (p *proc) exitCode() int {
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// run is one fault run: a redis-server, a history file, worker processes.
type run struct {
	t     *testing.T
	srv   *redistest.Server
	bin   string // the worker program; "" is workerBin
	hist  string
	name  string
	size  int
	ttl   time.Duration
	grace time.Duration
	base  []string      // worker arguments every worker gets
	adm   *admin.Handle // set by newSentinelRun: reads through its pool

	mu    sync.Mutex
	procs []*proc
	next  int
}

func newRun(t *testing.T, srv *redistest.Server, size int, ttl, grace time.Duration, extra ...string) *run {
	r := &run{t: t, srv: srv, hist: filepath.Join(t.TempDir(), "history.jsonl"), name: "faults-" + t.Name(),
		size: size, ttl: ttl, grace: grace}
	r.base = append([]string{"-addr", srv.Addr, "-hist", r.hist, "-name", r.name, "-size", strconv.Itoa(size),
		"-ttl", ttl.String(), "-grace", grace.String()}, extra...)
	t.Cleanup(r.stopAll)
	return r
}

// spawn starts a worker with the run's arguments plus args.
func (r *run) spawn(args ...string) *proc {
	bin := r.bin
	if bin == "" {
		bin = workerBin
	}
	return r.spawnWith(bin, args...)
}

// spawnWith is spawn of the worker program bin.
func (r *run) spawnWith(bin string, args ...string) *proc {
	r.mu.Lock()
	r.next++
	id := r.next
	r.mu.Unlock()
	all := append(append([]string{"-id", strconv.Itoa(id)}, r.base...), args...)
	cmd := exec.Command(bin, all...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(r.t, cmd.Start())
	p := &proc{id: id, cmd: cmd, stderr: &stderr, done: make(chan struct{}), start: time.Now(), bin: bin}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	return p
}

// stopAll kills every worker still running, by pid (resuming stopped ones
// first so that nothing is left frozen).
func (r *run) stopAll() {
	r.mu.Lock()
	ps := append([]*proc(nil), r.procs...)
	r.mu.Unlock()
	for _, p := range ps {
		if !p.exited() {
			_ = syscall.Kill(p.pid(), syscall.SIGCONT)
			p.kill9()
		}
	}
}

// stopFile is the file that workers spawned with "-stopfile" watch: once it
// exists they start no more acquisitions and exit.
func (r *run) stopFile() string { return filepath.Join(filepath.Dir(r.hist), "stop") }

// stop creates the stop file.
func (r *run) stop() {
	require.NoError(r.t, os.WriteFile(r.stopFile(), nil, 0o644))
}

// waitAll waits for every worker not killed by the test to exit by itself,
// and asserts that each exited 0.
func (r *run) waitAll(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	r.mu.Lock()
	ps := append([]*proc(nil), r.procs...)
	r.mu.Unlock()
	for _, p := range ps {
		if p.killed {
			continue
		}
		left := time.Until(deadline)
		if left < time.Second {
			left = time.Second
		}
		if !p.wait(left) {
			assert.Failf(r.t, "worker hung", "worker %d did not exit within %v; stderr: %s", p.id, timeout, p.stderr.String())
			continue
		}
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && r.selfKilled(p.pid()) {
			continue // it killed itself at the strand failpoint
		}
		assert.Equal(r.t, 0, p.exitCode(), "worker %d exit code; stderr: %s", p.id, p.stderr.String())
	}
}

// selfKilled reports whether the history shows pid killing itself at the
// strand failpoint.
func (r *run) selfKilled(pid int) bool {
	evs, _, _ := history.Read(r.hist)
	return count(evs, history.KFPKill, func(e history.Event) bool { return e.Pid == pid }) > 0
}

func (r *run) events() []history.Event {
	evs, bad, err := history.Read(r.hist)
	require.NoError(r.t, err)
	assert.Zero(r.t, bad, "unparsable history lines")
	return evs
}

// check runs the history checker and asserts it found nothing.
func (r *run) check(opt history.Options) history.Report {
	if opt.N == 0 {
		opt.N = r.size
	}
	rep := history.Check(r.events(), opt)
	for _, v := range rep.Violations {
		r.t.Errorf("history: %s", v)
	}
	return rep
}

// pool returns a pool on the run's server for the test's own clients.
func (r *run) pool() *redis.Pool { return r.srv.Pool(r.t) }

// sem returns the run's semaphore for the test's own use.
// ops is an admin.Handle for the run's semaphore, to read and reclaim it.
func (r *run) ops() *admin.Handle {
	if r.adm != nil {
		return r.adm
	}
	h, err := admin.New(r.pool(), redsem.DefaultPrefix, r.name)
	require.NoError(r.t, err)
	return h
}

func (r *run) sem(opts ...redsem.Option) *redsem.Semaphore {
	s, err := redsem.NewSemaphore(r.pool(), r.name, r.size,
		append([]redsem.Option{redsem.WithTTL(r.ttl), redsem.WithFixedTTL(), redsem.WithGrace(r.grace)}, opts...)...)
	require.NoError(r.t, err)
	return s
}

// quiesce waits, at most bound, until Reclaim and Status show exactly N valid
// free tokens, no lease and nothing stray, and reports how many tokens were
// missing at the end (tokens lost) and how long it took.
func quiesce(t *testing.T, ops *admin.Handle, sem *redsem.Semaphore, bound time.Duration) (admin.Status, int, time.Duration) {
	t.Helper()
	st, lost, took := settle(t, ops, sem, bound)
	assert.Equal(t, sem.Size(), st.Available, "valid free tokens after quiescence (%v): %+v", took, st)
	assert.Empty(t, st.Holders, "leases left after quiescence")
	assert.Zero(t, st.Stray, "stray tokens after quiescence")
	return st, lost, took
}

// settle is quiesce without the assertions.
func settle(t *testing.T, ops *admin.Handle, sem *redsem.Semaphore, bound time.Duration) (admin.Status, int, time.Duration) {
	t.Helper()
	start := time.Now()
	var st admin.Status
	var err error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, rerr := ops.Reclaim(ctx)
		st, err = ops.Status(ctx)
		cancel()
		if rerr == nil && err == nil && st.Available == sem.Size() && len(st.Holders) == 0 && st.Stray == 0 {
			break
		}
		if time.Since(start) > bound {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err)
	took := time.Since(start)
	return st, sem.Size() - st.Available, took
}

// pendKeys lists the semaphore's pending lists that hold something.
func pendKeys(t *testing.T, srv *redistest.Server, k history.Keys) map[string][]string {
	t.Helper()
	c, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer c.Close()
	out := map[string][]string{}
	cursor := "0"
	for i := 0; i < 1000; i++ {
		v, err := redis.Values(c.Do("SCAN", cursor, "MATCH", k.Base+"pend:*", "COUNT", 1000))
		require.NoError(t, err)
		cursor, _ = redis.String(v[0], nil)
		ks, _ := redis.Strings(v[1], nil)
		for _, key := range ks {
			toks, err := redis.Strings(c.Do("LRANGE", key, 0, -1))
			if err == nil && len(toks) > 0 {
				out[key] = toks
			}
		}
		if cursor == "0" {
			break
		}
	}
	return out
}

// clientsOf lists the CLIENT LIST entries, as field maps.
func clientList(t *testing.T, c redis.Conn) []map[string]string {
	s, err := redis.String(c.Do("CLIENT", "LIST"))
	require.NoError(t, err)
	var out []map[string]string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		m := map[string]string{}
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			m[k] = v
		}
		out = append(out, m)
	}
	return out
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// ctxT is a context that ends after d or with the test.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// count returns how many events of kind k the history holds, optionally
// filtered.
func count(evs []history.Event, k string, f func(history.Event) bool) int {
	n := 0
	for _, e := range evs {
		if e.K == k && (f == nil || f(e)) {
			n++
		}
	}
	return n
}

// status reads the semaphore's Status, retrying for up to 10s while the
// server restarts (a pooled connection to the old process fails once).
func status(t *testing.T, ops *admin.Handle) admin.Status {
	t.Helper()
	var st admin.Status
	var err error
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err = ops.Status(ctx)
		cancel()
		if err == nil {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err)
	return st
}
