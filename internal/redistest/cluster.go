package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Cluster is a Redis Cluster of redis-server processes started by
// StartCluster on loopback. Every node is killed by its pid when the test
// ends.
type Cluster struct {
	Nodes []*Server
	tb    testing.TB
}

// CliBinary returns the path of redis-cli, skipping the test when there is
// none, or failing it when REDSEM_REQUIRE_REDIS=1.
func CliBinary(tb testing.TB) string {
	tb.Helper()
	path, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("redis-cli not on PATH and %s=1", RequireEnv)
		}
		tb.Skipf("redis-cli not on PATH: install it (apt-get install redis-tools) or set %s=1 to fail instead", RequireEnv)
	}
	return path
}

// StartCluster starts masters*(1+replicas) cluster-enabled redis-servers
// (node timeout 2s) and joins them with `redis-cli --cluster create`, which
// splits the 16384 slots evenly over the masters. It returns once every node
// reports cluster_state:ok and every replica has finished its first sync.
func StartCluster(tb testing.TB, masters, replicas int, extra ...string) *Cluster {
	tb.Helper()
	Binary(tb)
	cli := CliBinary(tb)
	c := &Cluster{tb: tb}
	args := []string{"--cluster", "create"}
	for i := 0; i < masters*(1+replicas); i++ {
		s := Start(tb, append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}, extra...)...)
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	if masters < 3 {
		// redis-cli refuses fewer than 3 masters: assign the slots by hand.
		if replicas != 0 {
			tb.Fatalf("StartCluster: replicas need at least 3 masters")
		}
		c.assign()
	} else {
		args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
		out, err := exec.Command(cli, args...).CombinedOutput()
		if err != nil {
			tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
		}
	}
	c.WaitStable(20 * time.Second)
	return c
}

// assign splits the slots evenly over the nodes, all masters, and joins them.
func (c *Cluster) assign() {
	n := len(c.Nodes)
	for i, s := range c.Nodes {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if _, err := s.info("CLUSTER", "ADDSLOTSRANGE", lo, hi); err != nil {
			c.tb.Fatalf("ADDSLOTSRANGE on %s: %v", s.Addr, err)
		}
		if i > 0 {
			host, port, _ := strings.Cut(s.Addr, ":")
			if _, err := c.Nodes[0].info("CLUSTER", "MEET", host, port); err != nil {
				c.tb.Fatalf("CLUSTER MEET %s: %v", s.Addr, err)
			}
		}
	}
}

// WaitStable waits until every running node reports cluster_state:ok, all
// nodes agree on who owns every slot, no slot is migrating or importing, and
// every replica's link to its master is up.
func (c *Cluster) WaitStable(timeout time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		if why = c.unstable(); why == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.tb.Fatalf("cluster not stable after %v: %s", timeout, why)
}

func (c *Cluster) unstable() string {
	var want string
	for _, s := range c.Nodes {
		if s.done == nil {
			continue
		}
		info, err := s.info("CLUSTER", "INFO")
		if err != nil {
			return err.Error()
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return s.Addr + " not ok"
		}
		nodes, err := s.info("CLUSTER", "NODES")
		if err != nil {
			return err.Error()
		}
		if strings.Contains(nodes, "->-") || strings.Contains(nodes, "-<-") {
			return s.Addr + " has a slot in migration"
		}
		view := c.slotView(nodes)
		if want == "" {
			want = view
		} else if view != want {
			return s.Addr + " disagrees on slots"
		}
		repl, err := s.info("INFO", "replication")
		if err != nil {
			return err.Error()
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return s.Addr + " replica link down"
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_sync_in_progress:0") {
			return s.Addr + " replica syncing"
		}
	}
	return ""
}

// slotView reduces CLUSTER NODES to "addr slots..." of the masters, sorted
// by the order of c.Nodes, so two nodes' views compare as strings.
func (c *Cluster) slotView(nodes string) string {
	by := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		addr := f[1]
		if i := strings.IndexByte(addr, '@'); i >= 0 {
			addr = addr[:i]
		}
		by[addr] = strings.Join(f[8:], " ")
	}
	var b strings.Builder
	for _, s := range c.Nodes {
		if v, ok := by[s.Addr]; ok && v != "" {
			fmt.Fprintf(&b, "%s %s;", s.Addr, v)
		}
	}
	return b.String()
}

func (s *Server) info(cmd string, args ...interface{}) (string, error) {
	conn, err := redis.Dial("tcp", s.Addr, redis.DialConnectTimeout(time.Second),
		redis.DialReadTimeout(2*time.Second), redis.DialWriteTimeout(2*time.Second))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return redis.String(conn.Do(cmd, args...))
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Addrs returns the address of every node, masters and replicas.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Nodes {
		a = append(a, s.Addr)
	}
	return a
}

// Masters returns the running nodes that currently call themselves masters
// and own slots.
func (c *Cluster) Masters() []*Server {
	var m []*Server
	for _, s := range c.Nodes {
		if s.done == nil {
			continue
		}
		nodes, err := s.info("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 8 && strings.Contains(f[2], "myself") && strings.Contains(f[2], "master") {
				m = append(m, s)
			}
		}
	}
	return m
}

// Owner returns the master that owns slot, as the first reachable node sees it.
func (c *Cluster) Owner(slot int) *Server {
	c.tb.Helper()
	for _, s := range c.Nodes {
		if s.done == nil {
			continue
		}
		conn, err := redis.Dial("tcp", s.Addr, redis.DialConnectTimeout(time.Second), redis.DialReadTimeout(2*time.Second))
		if err != nil {
			continue
		}
		ranges, err := redis.Values(conn.Do("CLUSTER", "SLOTS"))
		conn.Close()
		if err != nil {
			continue
		}
		for _, r := range ranges {
			f, _ := redis.Values(r, nil)
			if len(f) < 3 {
				continue
			}
			lo, _ := redis.Int(f[0], nil)
			hi, _ := redis.Int(f[1], nil)
			if slot < lo || slot > hi {
				continue
			}
			m, _ := redis.Values(f[2], nil)
			if len(m) < 2 {
				continue
			}
			host, _ := redis.String(m[0], nil)
			port, _ := redis.Int(m[1], nil)
			return c.Node(host + ":" + strconv.Itoa(port))
		}
	}
	c.tb.Fatalf("no node knows the owner of slot %d", slot)
	return nil
}

// ReplicaOf returns a running replica of master.
func (c *Cluster) ReplicaOf(master *Server) *Server {
	c.tb.Helper()
	id := master.ID()
	for _, s := range c.Nodes {
		if s.done == nil || s == master {
			continue
		}
		nodes, err := s.info("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && strings.Contains(f[2], "myself") && strings.Contains(f[2], "slave") && f[3] == id {
				return s
			}
		}
	}
	c.tb.Fatalf("no replica of %s", master.Addr)
	return nil
}

// ID returns the node's cluster id.
func (s *Server) ID() string {
	s.tb.Helper()
	id, err := s.info("CLUSTER", "MYID")
	if err != nil {
		s.tb.Fatalf("CLUSTER MYID on %s: %v", s.Addr, err)
	}
	return id
}

// MoveSlot moves slot from its owner to dst the way redis-cli --cluster
// reshard does: SETSLOT IMPORTING on dst, MIGRATING on the source, MIGRATE of
// the keys in rounds until the source has none left (keys created on the
// source during the move go too), then SETSLOT NODE on dst, the source and
// every other master. between, when not nil, runs before every round, while
// the slot is migrating (before round 0 no key has moved yet); rounds stop
// once between has returned false and the source has no key left in the
// slot. It returns the number of keys moved.
func (c *Cluster) MoveSlot(slot int, dst *Server, between func(round int) bool) (int, error) {
	src := c.Owner(slot)
	if src == dst {
		return 0, fmt.Errorf("slot %d already on %s", slot, dst.Addr)
	}
	srcID, dstID := src.ID(), dst.ID()
	sc, err := redis.Dial("tcp", src.Addr, redis.DialReadTimeout(10*time.Second))
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	dc, err := redis.Dial("tcp", dst.Addr, redis.DialReadTimeout(10*time.Second))
	if err != nil {
		return 0, err
	}
	defer dc.Close()
	if _, err := dc.Do("CLUSTER", "SETSLOT", slot, "IMPORTING", srcID); err != nil {
		return 0, fmt.Errorf("IMPORTING: %w", err)
	}
	if _, err := sc.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", dstID); err != nil {
		return 0, fmt.Errorf("MIGRATING: %w", err)
	}
	host, port, _ := strings.Cut(dst.Addr, ":")
	moved := 0
	more := between != nil
	for round := 0; round < 1000; round++ {
		if more {
			more = between(round)
		}
		keys, err := redis.Strings(sc.Do("CLUSTER", "GETKEYSINSLOT", slot, 100))
		if err != nil {
			return moved, fmt.Errorf("GETKEYSINSLOT: %w", err)
		}
		if len(keys) > 0 {
			args := []interface{}{host, port, "", 0, 5000, "KEYS"}
			for _, k := range keys {
				args = append(args, k)
			}
			if _, err := sc.Do("MIGRATE", args...); err != nil {
				return moved, fmt.Errorf("MIGRATE: %w", err)
			}
			moved += len(keys)
		}
		if !more && len(keys) == 0 {
			break
		}
	}
	// Owner first, then the source, then everyone else, as redis-cli does.
	if _, err := dc.Do("CLUSTER", "SETSLOT", slot, "NODE", dstID); err != nil {
		return moved, fmt.Errorf("SETSLOT NODE on dst: %w", err)
	}
	if _, err := sc.Do("CLUSTER", "SETSLOT", slot, "NODE", dstID); err != nil {
		return moved, fmt.Errorf("SETSLOT NODE on src: %w", err)
	}
	for _, m := range c.Masters() {
		if m == src || m == dst {
			continue
		}
		conn, err := redis.Dial("tcp", m.Addr)
		if err != nil {
			continue
		}
		_, _ = conn.Do("CLUSTER", "SETSLOT", slot, "NODE", dstID)
		conn.Close()
	}
	return moved, nil
}

// Failover runs CLUSTER FAILOVER [mode] on replica (mode "" for the
// coordinated manual failover, "FORCE" or "TAKEOVER") and waits until it is
// a master and the cluster is stable again.
func (c *Cluster) Failover(replica *Server, mode string, timeout time.Duration) error {
	args := []interface{}{"FAILOVER"}
	if mode != "" {
		args = append(args, mode)
	}
	if _, err := replica.info("CLUSTER", args...); err != nil {
		return fmt.Errorf("CLUSTER FAILOVER %s: %w", mode, err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		repl, err := replica.info("INFO", "replication")
		if err == nil && strings.Contains(repl, "role:master") && c.unstable() == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not a stable master %v after CLUSTER FAILOVER: %s", replica.Addr, timeout, c.unstable())
}
