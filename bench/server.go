package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"
)

// server is a redis-server this program started on a free loopback port. It
// is stopped by its own pid and never touches any other Redis.
type server struct {
	Addr string
	dir  string
	pid  int
	done chan error
}

// startServer runs bin on a free 127.0.0.1 port with no persistence and waits
// until it answers PING.
func startServer(bin string) (*server, error) {
	dir, err := os.MkdirTemp("", "redsem-bench-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
		cmd := exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--protected-mode", "yes", "--maxclients", "4000",
			"--logfile", filepath.Join(dir, "redis.log"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		s.pid, s.done = cmd.Process.Pid, make(chan error, 1)
		go func() { s.done <- cmd.Wait() }()
		if lastErr = s.waitReady(); lastErr == nil {
			return s, nil
		}
		s.stop()
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server did not start: %v", lastErr)
}

func (s *server) waitReady() error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("exited early: %v", err)
		default:
		}
		if c, err := redis.Dial("tcp", s.Addr, redis.DialConnectTimeout(200*time.Millisecond)); err == nil {
			_, perr := c.Do("PING")
			c.Close()
			if perr == nil {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PING reply within 10s")
}

// stop kills the server by its pid and waits for it to exit.
func (s *server) stop() {
	if s.done == nil {
		return
	}
	_ = syscall.Kill(s.pid, syscall.SIGKILL)
	<-s.done
	s.done = nil
}

func (s *server) close() {
	s.stop()
	os.RemoveAll(s.dir)
}

// version returns redis_version from INFO server.
func (s *server) version() string {
	c, err := redis.Dial("tcp", s.Addr)
	if err != nil {
		return "?"
	}
	defer c.Close()
	info, _ := redis.String(c.Do("INFO", "server"))
	return infoField(info, "redis_version")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// infoField returns the value of "name:value" in an INFO reply.
func infoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// commandCalls sums the calls of every command in INFO commandstats, except
// INFO itself (the harness's own probes). Commands that scripts run are
// counted by Redis as calls of their own, so the sum includes them.
func commandCalls(info string) int64 {
	var n int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "cmdstat_")
		if !ok || strings.HasPrefix(rest, "info:") {
			continue
		}
		_, st, _ := strings.Cut(rest, ":")
		n += statField(st, "calls")
	}
	return n
}

// scriptCalls sums the calls of EVAL, EVALSHA and FCALL (the commands
// clients sent that run Lua) and the server time they took in µs, the commands the
// scripts ran included.
func scriptCalls(info string) (calls, usec int64) {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, st, _ := strings.Cut(sc.Text(), ":")
		if n, ok := strings.CutPrefix(name, "cmdstat_"); ok && isScript(n) {
			calls += statField(st, "calls")
			usec += statField(st, "usec")
		}
	}
	return calls, usec
}

// commandUsec returns the calls and usec of every command in an INFO
// commandstats reply, by lower-case name ("config|get" for subcommands).
func commandUsec(info string) map[string][2]int64 {
	m := map[string][2]int64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "cmdstat_")
		if !ok {
			continue
		}
		name, st, _ := strings.Cut(rest, ":")
		m[name] = [2]int64{statField(st, "calls"), statField(st, "usec")}
	}
	return m
}

// mainThreadCPU returns the CPU time, in µs, that Redis's main thread has
// used (user and system), from INFO cpu.
func mainThreadCPU(info string) float64 {
	var t float64
	for _, f := range []string{"used_cpu_user_main_thread", "used_cpu_sys_main_thread"} {
		v, _ := strconv.ParseFloat(infoField(info, f), 64)
		t += v * 1e6
	}
	return t
}

// statField returns field name of "calls=1,usec=2,...".
func statField(st, name string) int64 {
	for _, kv := range strings.Split(strings.TrimSpace(st), ",") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
