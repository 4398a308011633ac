// Command instructions counts the instructions redis-server executes per
// operation, under valgrind's callgrind: a figure that does not depend on
// how loaded the machine is, unlike the µs of INFO commandstats. The
// operations: two PINGs; an uncontended Acquire+Release, with and without
// idle expiry; a handoff (a pair, and a second one blocked behind it); and
// the floors of internal/floor and of leasefloor (pairs that are not
// redsem's). It starts its own redis-server under valgrind on a free
// loopback port (and stops it by pid); for each operation it warms up,
// zeroes the counters, runs it n times (n/20, at least 10, for the
// handoff, which waits 50 ms a round) and dumps them.
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
	"github.com/redsem/redsem/bench/leasefloor"
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
	// uncontended pair's is what contention adds. Each round waits 50 ms
	// for the waiter to block and asks Redis whether it did (INFO clients);
	// the same wait and question alone (Redis's timers run meanwhile) are
	// counted apart and taken off.
	contended, err := redsem.NewSemaphore(pool, fmt.Sprintf("instructions-contended-%d", time.Now().UnixNano()), 1)
	if err != nil {
		return err
	}
	blocked := func() (bool, error) {
		time.Sleep(50 * time.Millisecond)
		info, err := redis.String(conn.Do("INFO", "clients"))
		return strings.Contains(info, "blocked_clients:1\r\n"), err
	}
	waitAlone := &opCase{name: "a 50 ms wait and INFO clients", slow: true, op: func() error {
		_, err := blocked()
		return err
	}}
	// handoffOf is a handoff on a lock whose acquire returns its release.
	handoffOf := func(acquire func() (func() error, error)) func() error {
		return func() error {
			release, err := acquire()
			if err != nil {
				return err
			}
			done := make(chan error, 1)
			go func() {
				rel, err := acquire()
				if err == nil {
					err = rel()
				}
				done <- err
			}()
			ok, err := blocked()
			if err == nil && !ok {
				err = errors.New("the waiter had not blocked after 50 ms")
			}
			if err := release(); err != nil {
				return err
			}
			if werr := <-done; err == nil {
				err = werr
			}
			return err
		}
	}
	handoff := handoffOf(func() (func() error, error) {
		l, err := contended.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	})
	pings := func() error {
		if _, err := conn.Do("PING"); err != nil {
			return err
		}
		_, err := conn.Do("PING")
		return err
	}
	cases := []opCase{
		{name: "two PINGs", op: pings},
		{name: "Acquire+Release", op: plain},
		{name: "Acquire+Release, WithIdleExpiry", op: idle},
		{name: "a handoff: two Acquire+Release, the second blocked behind the first", op: handoff, slow: true, less: waitAlone},
	}
	// The floors of floor.All, on a connection of their own: what a pair
	// costs that is not redsem's (raw, setnx), or that calls two scripts
	// with keys and arguments like redsem's and does nothing (empty) or
	// only the pair's 10 commands (skeleton).
	fconn := pool.Get()
	defer fconn.Close()
	if err := floor.Setup(fconn); err != nil {
		return err
	}
	for _, f := range floor.All() {
		cases = append(cases, opCase{name: "floor " + f.Name, op: func() error { return f.Pair(fconn) }})
	}
	// The raw pass's handoff: BLPOP and LPUSH, each lock call on a
	// connection of its own.
	if _, err := fconn.Do("RPUSH", "instructions-raw-handoff", "1"); err != nil {
		return err
	}
	cases = append(cases, opCase{name: "floor raw, a handoff", slow: true, less: waitAlone, op: handoffOf(func() (func() error, error) {
		conn := pool.Get()
		tok, err := redis.Strings(conn.Do("BLPOP", "instructions-raw-handoff", 0))
		if err != nil {
			conn.Close()
			return nil, err
		}
		return func() error {
			defer conn.Close()
			_, err := conn.Do("LPUSH", "instructions-raw-handoff", tok[1])
			return err
		}, nil
	})})
	// The harness's lease floors (leasefloor): a raw pass plus the lease
	// record and the owner-checked release, in redsem's key layout, in one
	// record, and with no script; a pair, and a handoff like redsem's (each
	// lock call on a connection of its own).
	// The Function floors' libraries first (FUNCTION LOAD REPLACE).
	if _, err := leasefloor.LoadFunctions(fconn); err != nil {
		return err
	}
	for i, f := range []leasefloor.Floor{leasefloor.Lease, leasefloor.OneRecord, leasefloor.OneRecordFCall, leasefloor.Held, leasefloor.Kept, leasefloor.NoScript, leasefloor.Pipeline} {
		key := fmt.Sprintf("instructions-lease-%d", i)
		if err := f.Prepare(fconn, key, 4); err != nil {
			return err
		}
		hkey := key + "-handoff"
		if err := f.Prepare(fconn, hkey, 1); err != nil {
			return err
		}
		// The holder and the waiter of a handoff each keep a Lock of their
		// own (floor:pipeline's waiter writes its registration with the
		// wait once it has waited); handoffOf calls the holder's first.
		lk, lks, calls := f.Lock(key), [2]*leasefloor.Lock{f.Lock(hkey), f.Lock(hkey)}, 0
		cases = append(cases, opCase{name: f.Name, op: func() error {
			rel, err := lk.Acquire(ctx, fconn)
			if err != nil {
				return err
			}
			return rel(ctx, fconn)
		}}, opCase{name: f.Name + ", a handoff", slow: true, less: waitAlone, op: handoffOf(func() (func() error, error) {
			conn := pool.Get()
			calls++
			rel, err := lks[calls%2].Acquire(ctx, conn)
			if err != nil {
				conn.Close()
				return nil, err
			}
			return func() error {
				defer conn.Close()
				return rel(ctx, conn)
			}, nil
		})})
	}
	fmt.Printf("redis-server instructions per operation (callgrind, %d operations each, %d of the slow ones)\n\n", n, slowRounds(n))
	fmt.Println("| operation | instructions |")
	fmt.Println("|---|--:|")
	for _, c := range cases {
		per, err := c.count(cg, n)
		if err != nil {
			return err
		}
		if c.less != nil {
			less, err := c.less.count(cg, n)
			if err != nil {
				return err
			}
			per -= less
		}
		fmt.Printf("| %s | %d |\n", c.name, per)
	}
	return nil
}

// opCase is an operation to count.
type opCase struct {
	name string
	op   func() error
	// slow: op waits 50 ms, so it runs slowRounds(n) times, not n.
	slow bool
	// less, if set, is counted too, and its count per operation is taken
	// off this one's.
	less *opCase
}

func slowRounds(n int) int { return max(n/20, 10) }

// count warms c up, then returns the instructions Redis executed per run of
// c.op over n runs (slowRounds(n) if c is slow).
func (c *opCase) count(cg *counter, n int) (int64, error) {
	warm, ops := 200, n
	if c.slow {
		warm, ops = 5, slowRounds(n)
	}
	for i := 0; i < warm; i++ { // create, load the scripts
		if err := c.op(); err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	if _, err := cg.dump(); err != nil { // zero: what came before is dumped
		return 0, err
	}
	for i := 0; i < ops; i++ {
		if err := c.op(); err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	total, err := cg.dump()
	if err != nil {
		return 0, err
	}
	return total / int64(ops), nil
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
