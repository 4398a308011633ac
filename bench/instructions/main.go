// Command instructions counts the instructions redis-server executes per
// uncontended Acquire+Release pair, under valgrind's callgrind: a figure
// that does not depend on how loaded the machine is, unlike the µs of INFO
// commandstats. It starts its own redis-server under valgrind on a free
// loopback port (and stops it by pid), warms up, then for each case zeroes
// the counters, runs n operations and dumps them.
//
//	cd bench && go run ./instructions            # needs valgrind and redis-server
//	cd bench && go run ./instructions -n 5000
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
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

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/floor"
)

func main() {
	n := flag.Int("n", 2000, "operations per case")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "instructions:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	dir, err := os.MkdirTemp("", "redsem-callgrind-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "cg.%p"),
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	pool := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	conn, err := waitReady(pool)
	if err != nil {
		return err
	}
	defer conn.Close()
	cg := &counter{dir: dir, pid: strconv.Itoa(pid)}

	ctx := context.Background()
	pairOf := func(opts ...redsem.Option) (func() error, error) {
		s, err := redsem.NewSemaphore(pool, fmt.Sprintf("instructions-%d", time.Now().UnixNano()), 4, opts...)
		return func() error {
			l, err := s.Acquire(ctx)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, err
	}
	plain, err := pairOf()
	if err != nil {
		return err
	}
	idle, err := pairOf(redsem.WithIdleExpiry(time.Minute))
	if err != nil {
		return err
	}
	// A handoff: a holder, a waiter that blocks behind it (its first script
	// registers it, then BLMOVE and the script behind it wait), the holder's
	// release, the waiter's grant and release. Its count less an
	// uncontended pair's is what contention adds.
	contended, err := redsem.NewSemaphore(pool, fmt.Sprintf("instructions-contended-%d", time.Now().UnixNano()), 1)
	if err != nil {
		return err
	}
	handoff := func() error {
		held, err := contended.Acquire(ctx)
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			l, err := contended.Acquire(ctx)
			if err == nil {
				err = l.Release(ctx)
			}
			done <- err
		}()
		// Under valgrind a script takes about a millisecond: the waiter is
		// blocked well before this (checked by the BLMOVE count below).
		time.Sleep(50 * time.Millisecond)
		if err := held.Release(ctx); err != nil {
			return err
		}
		return <-done
	}
	cases := []struct {
		name string
		op   func() error
		// blocks: each op has one waiter block (BLMOVE), and sleeps 50 ms,
		// so it runs n/20 times.
		blocks bool
	}{
		{"two PINGs (the floor)", func() error {
			if _, err := conn.Do("PING"); err != nil {
				return err
			}
			_, err := conn.Do("PING")
			return err
		}, false},
		{"Acquire+Release", plain, false},
		{"Acquire+Release, WithIdleExpiry", idle, false},
		{"a handoff: two Acquire+Release, the second blocked behind the first", handoff, true},
	}
	// The floors of floor.All, on a connection of their own: what a
	// pair costs that is not redsem's (raw, setnx) or that calls two
	// scripts with redsem's keys and arguments and does nothing (empty) or
	// only the pair's 10 commands (skeleton).
	fconn := pool.Get()
	defer fconn.Close()
	if err := floor.Setup(fconn); err != nil {
		return err
	}
	for _, f := range floor.All() {
		cases = append(cases, struct {
			name   string
			op     func() error
			blocks bool
		}{"floor " + f.Name, func() error { return f.Pair(fconn) }, false})
	}
	fmt.Printf("redis-server instructions per operation (callgrind, %d operations each)\n\n", n)
	fmt.Println("| operation | instructions |")
	fmt.Println("|---|--:|")
	for _, c := range cases {
		warm := 200
		if c.blocks {
			warm = 5
		}
		for i := 0; i < warm; i++ { // create, load the scripts
			if err := c.op(); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		if _, err := cg.dump(); err != nil { // zero: what came before is dumped
			return err
		}
		ops := n
		if c.blocks {
			ops = max(n/20, 10)
		}
		if _, err := conn.Do("CONFIG", "RESETSTAT"); err != nil {
			return err
		}
		for i := 0; i < ops; i++ {
			if err := c.op(); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		total, err := cg.dump()
		if err != nil {
			return err
		}
		if c.blocks {
			info, err := redis.String(conn.Do("INFO", "commandstats"))
			if err != nil {
				return err
			}
			if !strings.Contains(info, fmt.Sprintf("cmdstat_blmove:calls=%d,", ops)) {
				return fmt.Errorf("%s: not every waiter blocked (%d rounds):\n%s", c.name, ops, info)
			}
		}
		fmt.Printf("| %s | %d |\n", c.name, total/int64(ops))
	}
	return nil
}

func waitReady(pool *redis.Pool) (redis.Conn, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn := pool.Get()
		_, err := conn.Do("PING")
		if err == nil {
			return conn, nil
		}
		conn.Close()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("redis-server under valgrind did not answer: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// counter dumps the callgrind counters of one process: each dump holds what
// ran since the one before.
type counter struct {
	dir, pid string
	dumps    int
}

func (c *counter) dump() (int64, error) {
	if out, err := exec.Command("callgrind_control", "-d", c.pid).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("callgrind_control: %v: %s", err, out)
	}
	c.dumps++
	file := filepath.Join(c.dir, fmt.Sprintf("cg.%s.%d", c.pid, c.dumps))
	for i := 0; i < 100; i++ {
		if n, err := totals(file); err == nil {
			return n, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("no totals in %s", file)
}

func totals(file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		for _, p := range []string{"totals:", "summary:"} {
			if rest, ok := strings.CutPrefix(sc.Text(), p); ok {
				return strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			}
		}
	}
	return 0, errors.New("not written yet")
}
