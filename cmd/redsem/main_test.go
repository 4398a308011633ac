//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redsem/redsem/internal/redistest"
)

// bin is the redsem binary built once by TestMain.
var bin string

// helperEnv makes the test binary act as a child command (see helperMain).
const helperEnv = "REDSEM_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	dir, err := os.MkdirTemp("", "redsem-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "redsem")
	// The go command that runs this test: on PATH, or under GOROOT.
	goTool := "go"
	if _, err := exec.LookPath(goTool); err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build redsem: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		// Every process a test started has been waited for, and every
		// in-process server closed.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutine leak: %v\n", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// helperMain is the test binary run as the command of redsem run. It writes
// "<mode> <pid> <REDSEM_FENCE> <REDSEM_SLOT> <REDSEM_TOKEN>" to $HELPER_DIR/<mode>.pid,
// logs the signals it gets to $HELPER_DIR/log, and sleeps at most 20s.
//
//	HELPER_TERM=exit:N   exit N on SIGTERM, SIGINT or SIGHUP (default exit:5)
//	HELPER_TERM=ignore   ignore them
//	HELPER_GRANDCHILD=1  also start a grandchild in the same process group
func helperMain(mode string) int {
	dir := os.Getenv("HELPER_DIR")
	logf := func(format string, args ...any) {
		f, err := os.OpenFile(filepath.Join(dir, "log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, format+"\n", args...)
			f.Close()
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	var grand *exec.Cmd
	if mode == "child" && os.Getenv("HELPER_GRANDCHILD") == "1" {
		exe, _ := os.Executable()
		grand = exec.Command(exe)
		grand.Env = append(os.Environ(), helperEnv+"=grandchild", "HELPER_TERM=exit:0")
		if err := grand.Start(); err != nil {
			logf("grandchild start: %v", err)
			return 99
		}
	}
	info := fmt.Sprintf("%s %d %s %s %s", mode, os.Getpid(), os.Getenv("REDSEM_FENCE"),
		os.Getenv("REDSEM_SLOT"), os.Getenv("REDSEM_TOKEN"))
	tmp := filepath.Join(dir, mode+".pid.tmp")
	_ = os.WriteFile(tmp, []byte(info), 0o644)
	_ = os.Rename(tmp, filepath.Join(dir, mode+".pid"))
	onTerm := os.Getenv("HELPER_TERM")
	if onTerm == "" {
		onTerm = "exit:5"
	}
	deadline := time.After(20 * time.Second)
	for {
		select {
		case s := <-sigs:
			logf("%s got %s", mode, s.(syscall.Signal))
			if onTerm == "ignore" {
				continue
			}
			if grand != nil {
				_ = grand.Wait()
			}
			code, _ := strconv.Atoi(strings.TrimPrefix(onTerm, "exit:"))
			return code
		case <-deadline:
			return 0
		}
	}
}

// env is one test's Redis and scratch directory.
type env struct {
	srv *redistest.Server
	url string
	dir string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := redistest.Start(t)
	return &env{srv: srv, url: "redis://" + srv.Addr + "/2", dir: t.TempDir()}
}

// command returns redsem with REDIS_URL pointing at the test's server (never
// an inherited one) and the helper's environment.
func (e *env) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cleanEnv(), "REDIS_URL="+e.url, "HELPER_DIR="+e.dir)
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "REDSEM_") && !strings.HasPrefix(kv, "HELPER_") {
			out = append(out, kv)
		}
	}
	return out
}

// result is how a redsem process ended.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// run runs redsem to the end, at most 20s.
func (e *env) run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := e.command(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := result{code: exitCodeOf(err), stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	require.NoError(t, ctx.Err(), "redsem %v did not finish in 20s; stderr: %s", args, r.stderr)
	return r
}

func exitCodeOf(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	default:
		return -1
	}
}

// proc is a redsem process started in the background.
type proc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
	err    error
}

// start starts redsem in its own process group; the test's cleanup kills
// whatever is left of it.
func (e *env) start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := e.command(context.Background(), args...)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		for _, mode := range []string{"child", "grandchild"} {
			if pid := helperPid(e.dir, mode); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return p
}

// wait waits at most d for the process and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return exitCodeOf(p.err)
	case <-time.After(d):
		require.FailNowf(t, "redsem still running", "after %v; stderr: %s", d, p.stderr.String())
		return -1
	}
}

// helperArgs returns the command line that runs the test binary as helper.
func helperArgs() []string {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return []string{"--", exe}
}

// helperEnvFor returns the environment for a helper in mode "child".
func helperEnvFor(extra ...string) []string {
	return append([]string{helperEnv + "=child"}, extra...)
}

// waitFor polls cond every 10ms for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNowf(t, "timed out", "waiting %v for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// helperInfo returns the fields the helper in mode wrote, or nil.
func helperInfo(dir, mode string) []string {
	b, err := os.ReadFile(filepath.Join(dir, mode+".pid"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

func helperPid(dir, mode string) int {
	f := helperInfo(dir, mode)
	if len(f) < 2 {
		return 0
	}
	pid, _ := strconv.Atoi(f[1])
	return pid
}

// waitHelper waits until the helper in mode has started and returns its pid.
func waitHelper(t *testing.T, dir, mode string) int {
	t.Helper()
	waitFor(t, 10*time.Second, mode+" to start", func() bool { return helperPid(dir, mode) > 0 })
	return helperPid(dir, mode)
}

// alive reports whether pid runs (a zombie does not count: it has exited
// and waits for a parent that may be an init that never reaps).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) && runtime.GOOS != "linux"
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

func logLines(dir string) []string {
	b, _ := os.ReadFile(filepath.Join(dir, "log"))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}
