//go:build unix

package main

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// guardCommand is the hidden subcommand of the guard process.
const guardCommand = "__guard"

// guard is a small redsem process that kills the command's process group if
// redsem dies without saying goodbye (kill -9, OOM killer). The parent-death
// signal only reaches the command's first process; the guard reaches the
// processes it started too, and works on every Unix.
//
// It reads a pipe whose only writer is redsem: one byte means "done, leave
// the group alone"; end of file without it means redsem is gone.
type guard struct {
	w   *os.File
	cmd *exec.Cmd
}

func startGuard(pgid int) (*guard, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, guardCommand, strconv.Itoa(pgid))
	cmd.ExtraFiles = []*os.File{r} // fd 3
	// Its own group: signals for redsem's group or the command's pass it by.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return &guard{w: w, cmd: cmd}, nil
}

// dismiss tells the guard the command is done and waits for it briefly.
func (g *guard) dismiss() {
	if g == nil {
		return
	}
	_, _ = g.w.Write([]byte{'x'})
	g.w.Close()
	done := make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		_ = g.cmd.Process.Kill()
	}
}

// runGuard is the guard process: it waits for redsem's goodbye or death.
func runGuard(args []string) int {
	if len(args) != 1 {
		return exitUsage
	}
	pgid, err := strconv.Atoi(args[0])
	if err != nil || pgid <= 1 {
		return exitUsage
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTERM,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	f := os.NewFile(3, "redsem-guard")
	buf := make([]byte, 1)
	n, _ := f.Read(buf)
	if n == 1 {
		return exitOK
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return exitOK
}
