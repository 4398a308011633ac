//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redsem/redsem"
)

// held is what supervise runs a command under: a *redsem.Lease (run), or
// a leadership (elect).
type held interface {
	Valid() bool
	Done() <-chan struct{}
	Err() error
	Release(ctx context.Context) error
}

// supervise runs the command while lease is held and returns its exit
// status as an *exitError (nil for 0). The lease is released on every path.
// With no lease (run --rate alone) the command just runs; env (with the
// lease's variables, leaseEnv) is added to its environment.
func supervise(lease held, env []string, o *runOptions, sigs <-chan os.Signal, stderr io.Writer) error {
	release := func(timeout time.Duration) error {
		if lease == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return lease.Release(ctx)
	}
	if lease != nil && !lease.Valid() {
		_ = release(opTimeout)
		return exitf(o.lostCode, "lease on %q lost before the command started: %v", o.name, lease.Err())
	}
	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(append(os.Environ(), "REDSEM_NAME="+o.name), env...)
	cmd.SysProcAttr = childAttr()
	// On a terminal, the command's group takes the foreground while it
	// runs: it reads the terminal, and Ctrl-C and Ctrl-\ reach it there.
	// Ctrl-Z would stop it, holding its slot: a stopped command is
	// continued at once (SIGCHLD), as redsem itself ignores Ctrl-Z.
	var stopped chan os.Signal
	fg := ttyForeground(os.Stdin)
	if fg {
		foregroundAttr(cmd.SysProcAttr, os.Stdin)
		stopped = make(chan os.Signal, 1)
		signal.Notify(stopped, syscall.SIGCHLD)
		defer signal.Stop(stopped)
	}
	exited, err := startLocked(cmd)
	if err != nil {
		_ = release(opTimeout)
		return startError(o.argv[0], err)
	}
	pgid := cmd.Process.Pid
	g, gerr := startGuard(pgid)
	if gerr != nil {
		fmt.Fprintf(stderr, "redsem: warning: no guard process (%v): if redsem is killed, only the command's first process is stopped\n", gerr)
	}

	var leaseDone <-chan struct{}
	if lease != nil {
		leaseDone = lease.Done()
	}
	var (
		killTimer <-chan time.Time
		lost      error
		state     *os.ProcessState
	)
	for state == nil {
		select {
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-leaseDone:
			leaseDone = nil
			lost = lease.Err()
			fmt.Fprintf(stderr, "redsem: lease on %q ended (%s): stopping the command (TERM, then KILL after %v)\n",
				o.name, strings.TrimPrefix(lost.Error(), "redsem: "), o.killAfter.d)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			killTimer = time.After(o.killAfter.d)
		case <-killTimer:
			killTimer = nil
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		case <-stopped:
			_ = syscall.Kill(-pgid, syscall.SIGCONT)
		case state = <-exited:
		}
	}
	if fg {
		takeTerminal(os.Stdin)
	}
	if lost != nil {
		// Whatever of the group outlived its leader has no slot either.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	g.dismiss()
	code := exitCode(state)
	if lost != nil {
		// Most likely in vain (lost), or Redis is unreachable (expired):
		// do not keep the caller waiting long.
		_ = release(lostReleaseTimeout)
		return exitf(o.lostCode, "")
	}
	if err := release(opTimeout); err != nil {
		if errors.Is(err, redsem.ErrLeaseLost) {
			return exitf(o.lostCode, "lease on %q was lost before the command finished (command exit code %d)", o.name, code)
		}
		// The command ran with its slot; the lease will expire by itself.
		fmt.Fprintf(stderr, "redsem: warning: release of %q failed, the slot frees itself within the TTL: %v\n", o.name, err)
	}
	if code == 0 {
		return nil
	}
	return exitf(code, "")
}

// leaseEnv is the environment run gives a command holding lease.
func leaseEnv(lease *redsem.Lease, o *runOptions) []string {
	return []string{
		"REDSEM_SIZE=" + strconv.Itoa(o.size),
		"REDSEM_TOKEN=" + lease.Token(),
		"REDSEM_SLOT=" + slotOf(lease.Token()),
		"REDSEM_FENCE=" + strconv.FormatInt(lease.Fence(), 10),
	}
}

// lostReleaseTimeout bounds the release attempt after the lease was lost.
const lostReleaseTimeout = 2 * time.Second

// startLocked starts cmd from a goroutine locked to its OS thread and waits
// for it there. On Linux the child's parent-death signal fires when the
// thread that forked it ends, not the process: keeping that thread locked
// until the child has exited ties the signal to the whole redsem process.
func startLocked(cmd *exec.Cmd) (<-chan *os.ProcessState, error) {
	started := make(chan error, 1)
	exited := make(chan *os.ProcessState, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the runtime retires this thread when the
		// goroutine returns, after the child has been waited for.
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		exited <- cmd.ProcessState
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// exitCode is the shell's view of how a process ended.
func exitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	return st.ExitCode()
}

func startError(name string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return exitf(exitNotFound, "%s: command not found", name)
	default:
		return exitf(exitCannotExec, "cannot run %s: %v", name, err)
	}
}
