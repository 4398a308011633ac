// Package redistest starts real redis-server processes for tests: each on a
// free loopback port, in its own temporary directory, stopped by its own pid
// when the test ends. It never touches a Redis it did not start.
package redistest

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// RequireEnv names the environment variable that turns a missing
// redis-server from a skip into a failure. CI sets it.
const RequireEnv = "REDSEM_REQUIRE_REDIS"

// Server is one redis-server process started by Start.
type Server struct {
	Addr string
	Port int
	Dir  string
	bin  string
	args []string
	pid  int
	done chan error // receives the exit status of the current process
	held int        // a socket bound to Port while the server is down; 0: none
	ping []redis.DialOption
	tb   testing.TB
}

// Binary returns the path of redis-server, skipping the test when there is
// none, or failing it when REDSEM_REQUIRE_REDIS=1.
func Binary(tb testing.TB) string {
	tb.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("redis-server not on PATH and %s=1", RequireEnv)
		}
		tb.Skipf("redis-server not on PATH: install it (apt-get install redis-server) or set %s=1 to fail instead", RequireEnv)
	}
	return path
}

// Tool returns the path of another program a test needs (script(1) for a
// pseudo-terminal, say), skipping the test when it is not on PATH, or
// failing it when REDSEM_REQUIRE_REDIS=1: CI installs what its tests run,
// so there a missing tool is a broken setup, not a reason to test less.
// install says how to get it (e.g. "apt-get install util-linux").
func Tool(tb testing.TB, name, install string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%s not on PATH and %s=1: %s", name, RequireEnv, install)
		}
		tb.Skipf("%s not on PATH: %s, or set %s=1 to fail instead", name, install, RequireEnv)
	}
	return path
}

// Start runs redis-server on a free loopback port with no persistence and
// DEBUG enabled for local clients; extra arguments are appended as given
// (e.g. "--appendonly", "yes"). The server is killed when the test ends.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return startWith(tb, func(s *Server) []string {
		return append([]string{
			"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
			"--dir", s.Dir, "--save", "", "--appendonly", "no",
			"--enable-debug-command", "local", "--protected-mode", "yes",
			"--logfile", filepath.Join(s.Dir, "redis.log"),
		}, extra...)
	}, nil)
}

// startWith starts redis-server with the arguments args returns for the
// chosen port and directory; ping, when not nil, dials the readiness check
// (a server with a password needs one).
func startWith(tb testing.TB, args func(s *Server) []string, ping []redis.DialOption) *Server {
	tb.Helper()
	bin := Binary(tb)
	s := &Server{Dir: tb.TempDir(), tb: tb, bin: bin, ping: ping}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatalf("free port: %v", err)
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.args = args(s)
		if lastErr = s.start(); lastErr == nil {
			tb.Cleanup(func() { s.Kill(); s.unhold() })
			return s
		}
	}
	tb.Fatalf("redis-server did not start: %v", lastErr)
	return nil
}

func (s *Server) start() error {
	s.unhold()
	cmd := exec.Command(s.bin, s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited early: %v; log: %s", err, s.logTail())
		default:
		}
		if c, err := redis.Dial("tcp", s.Addr, append([]redis.DialOption{redis.DialConnectTimeout(200 * time.Millisecond)}, s.ping...)...); err == nil {
			info, perr := redis.String(c.Do("INFO", "server"))
			c.Close()
			// Another test's server may hold the port (two picked it at
			// once, and ours is about to fail to bind): only our process's
			// answer counts.
			if perr == nil && strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
				s.pid, s.done = cmd.Process.Pid, exited
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("no PING reply within 10s; log: %s", s.logTail())
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Pid returns the pid of the running redis-server process.
func (s *Server) Pid() int { return s.pid }

// Kill stops the server with SIGKILL and waits for it; a no-op when it is
// not running. Its port stays taken until Restart or the test's end (a
// socket bound to it that does not listen), so that a client dialing it is
// refused, as by a server that is gone, and never reaches the server
// another test started on a port freed a moment before.
func (s *Server) Kill() {
	if s.done == nil {
		return
	}
	_ = syscall.Kill(s.pid, syscall.SIGKILL)
	<-s.done
	s.done = nil
	s.hold()
}

// hold binds a socket to the server's port, without listening: the
// kernel's choice of a free port (every test server's and miniredis's)
// passes over it, and a connect to it is refused. SO_REUSEADDR lets it
// bind while the killed server's connections linger in TIME_WAIT. A
// failure leaves the port as it is.
func (s *Server) hold() {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if syscall.Bind(fd, &syscall.SockaddrInet4{Port: s.Port, Addr: [4]byte{127, 0, 0, 1}}) != nil {
		syscall.Close(fd)
		return
	}
	s.held = fd
}

// unhold frees the port hold took, if it did.
func (s *Server) unhold() {
	if s.held != 0 {
		syscall.Close(s.held)
		s.held = 0
	}
}

// Signal sends sig to the server process (e.g. SIGSTOP, SIGCONT).
func (s *Server) Signal(sig syscall.Signal) error { return syscall.Kill(s.pid, sig) }

// Restart kills the server and starts it again on the same port with the
// same arguments and directory.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.tb.Fatalf("restart redis-server: %v", err)
}

// Pool returns a redigo pool for the server, closed when the test ends.
func (s *Server) Pool(tb testing.TB, opts ...redis.DialOption) *redis.Pool {
	p := &redis.Pool{
		MaxIdle: 64,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", s.Addr, append([]redis.DialOption{redis.DialConnectTimeout(2 * time.Second)}, opts...)...)
		},
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// Do runs one command on a fresh connection, failing the test on error.
func (s *Server) Do(tb testing.TB, cmd string, args ...interface{}) interface{} {
	tb.Helper()
	c, err := redis.Dial("tcp", s.Addr)
	if err != nil {
		tb.Fatalf("dial %s: %v", s.Addr, err)
	}
	defer c.Close()
	v, err := c.Do(cmd, args...)
	if err != nil {
		tb.Fatalf("%s: %v", cmd, err)
	}
	return v
}

// CommandCalls returns how many times each command ran on the server since
// it started or since CONFIG RESETSTAT, from INFO commandstats: lower-case
// command names ("scan", "evalsha"); commands that scripts run count too.
func (s *Server) CommandCalls(tb testing.TB) map[string]int {
	tb.Helper()
	info, err := redis.String(s.Do(tb, "INFO", "commandstats"), nil)
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					tb.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				calls[cmd] = n
			}
		}
	}
	return calls
}

// MoreParallel sets -test.parallel to n unless the command line set it: for
// a TestMain whose parallel tests mostly wait on servers and processes of
// their own, so more of them than go test's default of one per core can
// run at once. It parses the flags.
func MoreParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}
