package main

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/bench/leasefloor"
)

// env is the harness's view of the server: an uncounted admin connection for
// INFO, and unique key names so that no run sees another's state.
type env struct {
	addr  string
	mu    sync.Mutex
	admin redis.Conn
	seq   int
}

func newEnv(addr string) (*env, error) {
	c, err := redis.Dial("tcp", addr, redis.DialReadTimeout(10*time.Second))
	if err != nil {
		return nil, err
	}
	return &env{addr: addr, admin: c}, nil
}

func (e *env) close() { e.admin.Close() }

func (e *env) key(lib, scenario string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	return fmt.Sprintf("bench:%d:%s:%s", e.seq, lib, scenario)
}

func (e *env) do(cmd string, args ...interface{}) (interface{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.admin.Do(cmd, args...)
}

func (e *env) info(sections ...string) string {
	args := make([]interface{}, len(sections))
	for i, s := range sections {
		args[i] = s
	}
	s, err := redis.String(e.do("INFO", args...))
	if err != nil {
		panic(fmt.Sprintf("INFO %v: %v", sections, err))
	}
	return s
}

// stats is one sample of INFO commandstats and cpu.
type stats struct {
	calls, scripts, scriptUsec int64
	byName                     map[string][2]int64 // name -> calls, usec
	cpuUs                      float64             // CPU time of Redis's main thread, user and system
}

func (e *env) stats() stats {
	info := e.info("commandstats", "cpu")
	sc, us := scriptCalls(info)
	return stats{calls: commandCalls(info), scripts: sc, scriptUsec: us, byName: commandUsec(info), cpuUs: mainThreadCPU(info)}
}

// serverCPU is the CPU time, in µs, of Redis's main thread between samples
// s0 and s1, less the time of the harness's own INFO calls. Unlike the usec
// of commandstats, which is wall time and grows whenever another process
// takes the CPU from Redis, it does not count time Redis was not running;
// and it counts all Redis does for a command: reading and parsing it,
// running it, writing the reply, waking blocked clients.
func serverCPU(s0, s1 stats) float64 {
	return s1.cpuUs - s0.cpuUs - float64(s1.byName["info"][1]-s0.byName["info"][1])
}

// serverUsec is the Redis server time, in µs, of the commands clients sent
// between samples s0 and s1, from INFO commandstats: every command's usec,
// but those that scripts ran (already in the script's own usec). sent is
// what the clients sent, by name, meanwhile: a command both sent and run by
// scripts counts in proportion.
func serverUsec(s0, s1 stats, sent map[string]int64) float64 {
	var t float64
	for name, v := range s1.byName {
		calls, usec := v[0]-s0.byName[name][0], v[1]-s0.byName[name][1]
		if calls <= 0 || name == "info" {
			continue
		}
		if isScript(name) {
			t += float64(usec)
			continue
		}
		t += float64(usec) * min(1, float64(sent[name])/float64(calls))
	}
	return t
}

// isScript reports whether the command named name (lower case, as in
// commandstats) runs Lua: its usec includes the commands the Lua ran.
func isScript(name string) bool { return name == "eval" || name == "evalsha" || name == "fcall" }

// sentSince returns what c counted as sent since before (a sentByName), by
// name.
func sentSince(c *counters, before map[string]int64) map[string]int64 {
	now := c.sentByName()
	for k, v := range before {
		now[k] -= v
	}
	return now
}

func (e *env) clientsField(name string) int {
	n, _ := strconv.Atoi(infoField(e.info("clients"), name))
	return n
}

// waitBlocked polls INFO clients until at least n clients are blocked, or
// the timeout passes; it reports whether they were.
func (e *env) waitBlocked(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if e.clientsField("blocked_clients") >= n {
			return true
		}
		time.Sleep(100 * time.Microsecond)
	}
	return false
}

// loadFunctions loads the floors' Function libraries on the harness's
// connection and returns what that cost Redis (commandstats): the calls
// and µs of FUNCTION LOAD.
func (e *env) loadFunctions() (fnLoad, error) {
	s0 := e.stats()
	e.mu.Lock()
	_, err := leasefloor.LoadFunctions(e.admin)
	e.mu.Unlock()
	v0, v1 := s0.byName["function|load"], e.stats().byName["function|load"]
	return fnLoad{Calls: v1[0] - v0[0], Usec: v1[1] - v0[1]}, err
}

// fnLoad is what loading the Function libraries cost at the run's start.
type fnLoad struct {
	Calls int64 `json:"calls"`
	Usec  int64 `json:"redis_us"`
}

func (e *env) prepare(l *lib, key string, size int) error {
	if l.prepare == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return l.prepare(e.admin, key, size)
}

// measured is what the server and the clients did in a load run's window.
type measured struct {
	rt0, cmd0, rt1, cmd1 int64
	s0, s1               stats
	sent                 map[string]int64
}

// measureWindow starts a load run's workers (it closes start) with the
// window [*from, *deadline): dur long, after a fifth of it to warm up, and
// reads the clients' counters c and the server's statistics at its ends.
func (e *env) measureWindow(c *counters, start chan struct{}, dur time.Duration, from, deadline *time.Time) measured {
	*from = time.Now().Add(dur / 5)
	*deadline = from.Add(dur)
	close(start)
	time.Sleep(time.Until(*from))
	var m measured
	m.rt0, m.cmd0 = c.snapshot()
	sent0 := c.sentByName()
	m.s0 = e.stats()
	time.Sleep(time.Until(*deadline))
	m.s1 = e.stats()
	m.rt1, m.cmd1 = c.snapshot()
	m.sent = sentSince(c, sent0)
	return m
}

// add writes the window's figures per op (n ops) into out: round trips,
// commands sent, Redis commands, server µs, CPU µs, script µs, and per command.
func (m measured) add(out metrics, n float64) {
	out["roundtrips"] = float64(m.rt1-m.rt0) / n
	out["sent_cmds"] = float64(m.cmd1-m.cmd0) / n
	out["redis_cmds"] = float64(m.s1.calls-m.s0.calls) / n
	out["server_us"] = serverUsec(m.s0, m.s1, m.sent) / n
	out["cpu_us"] = serverCPU(m.s0, m.s1) / n
	out["script_us"] = float64(m.s1.scriptUsec-m.s0.scriptUsec) / n
	perCommand(out, addCommands(nil, m.s0, m.s1), n)
}
