package redistest

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// SentinelName is the name under which the sentinels of StartSentinels
// monitor their master.
const SentinelName = "m"

// Sentinels is a master, its replicas and the Redis Sentinels that watch
// them, every one a redis-server process started by StartSentinels on
// loopback and killed by its pid when the test ends.
type Sentinels struct {
	// Data are the data nodes; Data[0] was the first master.
	Data []*Server
	// Sentinels are the redis-server processes running with --sentinel.
	Sentinels []*Server
	password  string // data nodes'
	sentPass  string // sentinels'
	tls       *tls.Config
	tb        testing.TB
}

// SentinelOptions shape the topology of StartSentinels.
type SentinelOptions struct {
	Replicas  int // replicas of the master; default 2
	Sentinels int // sentinels; default 3, quorum a majority of them
	// Password, when set, is required by every data node and every
	// sentinel (requirepass), and used between them (masterauth,
	// sentinel auth-pass).
	Password string
	// SentinelPassword, when set, is the sentinels' own requirepass in
	// place of Password (which they still use toward the data nodes).
	SentinelPassword string
	// TLS, when set, makes every data node and sentinel listen on TLS
	// only, replicate and monitor over TLS, and not ask clients for a
	// certificate.
	TLS *TLS
}

// TLS is what a TLS-only topology serves: PEM files of a CA, and of a
// certificate it signed for 127.0.0.1, with its key. Config is what the
// topology's own connections use.
type TLS struct {
	CAFile, CertFile, KeyFile string
	Config                    *tls.Config
}

func (t *TLS) args() []string {
	return []string{"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile,
		"--tls-ca-cert-file", t.CAFile, "--tls-auth-clients", "no", "--tls-replication", "yes"}
}

// StartSentinels starts a master, its replicas (and waits for their first
// sync), then the sentinels, with the small timeouts that make a failover
// take a few seconds: down-after-milliseconds 1000, failover-timeout 5000.
// It returns once every sentinel knows every replica and every other
// sentinel, so that a kill of the master reaches the quorum.
func StartSentinels(tb testing.TB, o SentinelOptions) *Sentinels {
	tb.Helper()
	if o.Replicas == 0 {
		o.Replicas = 2
	}
	if o.Sentinels == 0 {
		o.Sentinels = 3
	}
	set := &Sentinels{password: o.Password, sentPass: o.Password, tb: tb}
	if o.SentinelPassword != "" {
		set.sentPass = o.SentinelPassword
	}
	var auth []string
	if o.Password != "" {
		auth = []string{"--requirepass", o.Password, "--masterauth", o.Password}
	}
	if o.TLS != nil {
		set.tls = o.TLS.Config
		auth = append(auth, o.TLS.args()...)
	}
	data := func(s *Server) []string {
		a := dataArgs(s)
		if o.TLS != nil {
			a = append(a, "--port", "0", "--tls-port", strconv.Itoa(s.Port))
		}
		return append(a, auth...)
	}
	master := startWith(tb, data, set.dialOpts(false))
	set.Data = append(set.Data, master)
	for i := 0; i < o.Replicas; i++ {
		r := startWith(tb, func(s *Server) []string {
			return append(data(s), "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
		}, set.dialOpts(false))
		set.Data = append(set.Data, r)
	}
	if err := set.WaitReplicas(master, o.Replicas, 20*time.Second); err != nil {
		tb.Fatalf("StartSentinels: %v", err)
	}
	quorum := o.Sentinels/2 + 1
	for i := 0; i < o.Sentinels; i++ {
		s := startWith(tb, func(s *Server) []string {
			conf := filepath.Join(s.Dir, "sentinel.conf")
			var b strings.Builder
			fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d %d\n", SentinelName, master.Port, quorum)
			fmt.Fprintf(&b, "sentinel down-after-milliseconds %s 1000\n", SentinelName)
			fmt.Fprintf(&b, "sentinel failover-timeout %s 5000\n", SentinelName)
			fmt.Fprintf(&b, "sentinel parallel-syncs %s %d\n", SentinelName, o.Replicas)
			if o.Password != "" {
				fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", SentinelName, o.Password)
			}
			if set.sentPass != "" {
				fmt.Fprintf(&b, "requirepass %s\n", set.sentPass)
			}
			if o.TLS != nil {
				fmt.Fprintf(&b, "tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-auth-clients no\ntls-replication yes\n",
					o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile)
			}
			if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
				tb.Fatalf("sentinel.conf: %v", err)
			}
			port := []string{"--port", strconv.Itoa(s.Port)}
			if o.TLS != nil {
				port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port)}
			}
			return append(append([]string{conf, "--sentinel"}, port...), "--bind", "127.0.0.1",
				"--dir", s.Dir, "--logfile", filepath.Join(s.Dir, "redis.log"))
		}, set.dialOpts(true))
		set.Sentinels = append(set.Sentinels, s)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range set.Sentinels {
		for {
			m, err := set.masterInfo(s)
			if err == nil && m["num-slaves"] == strconv.Itoa(o.Replicas) && m["num-other-sentinels"] == strconv.Itoa(o.Sentinels-1) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("StartSentinels: sentinel %s does not know the topology after 30s: %v %v", s.Addr, m, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return set
}

func dataArgs(s *Server) []string {
	return []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--dir", s.Dir, "--save", "", "--appendonly", "no",
		"--enable-debug-command", "local", "--protected-mode", "yes",
		"--logfile", filepath.Join(s.Dir, "redis.log"),
	}
}

// dialOpts are the options of the topology's own connections to a data
// node, or to a sentinel.
func (set *Sentinels) dialOpts(sentinel bool) []redis.DialOption {
	opts := []redis.DialOption{redis.DialConnectTimeout(time.Second),
		redis.DialReadTimeout(2 * time.Second), redis.DialWriteTimeout(2 * time.Second)}
	pw := set.password
	if sentinel {
		pw = set.sentPass
	}
	if pw != "" {
		opts = append(opts, redis.DialPassword(pw))
	}
	if set.tls != nil {
		opts = append(opts, redis.DialUseTLS(true), redis.DialTLSConfig(set.tls))
	}
	return opts
}

func (set *Sentinels) isSentinel(s *Server) bool {
	for _, x := range set.Sentinels {
		if x == s {
			return true
		}
	}
	return false
}

func (set *Sentinels) do(s *Server, cmd string, args ...interface{}) (interface{}, error) {
	c, err := redis.Dial("tcp", s.Addr, set.dialOpts(set.isSentinel(s))...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Do(cmd, args...)
}

// masterInfo is SENTINEL MASTER as a map.
func (set *Sentinels) masterInfo(s *Server) (map[string]string, error) {
	return redis.StringMap(set.do(s, "SENTINEL", "MASTER", SentinelName))
}

// Addrs returns the addresses of the sentinels.
func (set *Sentinels) Addrs() []string {
	var a []string
	for _, s := range set.Sentinels {
		a = append(a, s.Addr)
	}
	return a
}

// Node returns the data node listening on addr, or nil.
func (set *Sentinels) Node(addr string) *Server {
	for _, s := range set.Data {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Do runs one command on a fresh connection to s (a data node or a
// sentinel), with the topology's password (and TLS) for its kind.
func (set *Sentinels) Do(s *Server, cmd string, args ...interface{}) (interface{}, error) {
	return set.do(s, cmd, args...)
}

// Master returns the data node the first answering sentinel names as the
// master.
func (set *Sentinels) Master() *Server {
	set.tb.Helper()
	for _, s := range set.Sentinels {
		if addr, err := set.masterAddr(s); err == nil {
			if n := set.Node(addr); n != nil {
				return n
			}
		}
	}
	set.tb.Fatalf("no sentinel names a master")
	return nil
}

func (set *Sentinels) masterAddr(s *Server) (string, error) {
	v, err := redis.Strings(set.do(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelName))
	if err != nil {
		return "", err
	}
	if len(v) != 2 {
		return "", fmt.Errorf("bad reply %v", v)
	}
	return v[0] + ":" + v[1], nil
}

// Failover runs SENTINEL FAILOVER on the first sentinel and waits until a
// new master has taken over (see WaitNewMaster). It returns the new master
// and how long the switch took as the sentinels report it; before it
// returns, it also waits until no sentinel reports the failover in
// progress, so that another may follow.
func (set *Sentinels) Failover(timeout time.Duration) (*Server, time.Duration, error) {
	old := set.Master()
	start := time.Now()
	if _, err := set.do(set.Sentinels[0], "SENTINEL", "FAILOVER", SentinelName); err != nil {
		return nil, 0, fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	m, err := set.WaitNewMaster(old, timeout)
	took := time.Since(start)
	if err != nil {
		return nil, took, err
	}
	return m, took, set.WaitFailoverEnd(timeout)
}

// WaitFailoverEnd waits until no running sentinel reports a failover in
// progress.
func (set *Sentinels) WaitFailoverEnd(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		busy := ""
		for _, s := range set.Sentinels {
			if s.done == nil {
				continue
			}
			m, err := set.masterInfo(s)
			if err != nil || strings.Contains(m["flags"], "failover_in_progress") {
				busy = s.Addr
			}
		}
		if busy == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinel %s still runs a failover after %v", busy, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitNewMaster waits until every running sentinel names a master other
// than old and that node answers ROLE as a master.
func (set *Sentinels) WaitNewMaster(old *Server, timeout time.Duration) (*Server, error) {
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		why = ""
		var addr string
		for _, s := range set.Sentinels {
			if s.done == nil {
				continue
			}
			a, err := set.masterAddr(s)
			switch {
			case err != nil:
				why = err.Error()
			case a == old.Addr:
				why = s.Addr + " still names " + a
			case addr != "" && a != addr:
				why = "sentinels disagree"
			}
			addr = a
		}
		if why == "" {
			n := set.Node(addr)
			if n == nil {
				return nil, fmt.Errorf("sentinels name %s, not a data node", addr)
			}
			role, err := redis.Values(set.do(n, "ROLE"))
			if err == nil && len(role) > 0 && fmt.Sprintf("%s", role[0]) == "master" {
				return n, nil
			}
			why = addr + " is not a master yet"
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, fmt.Errorf("no new master after %v: %s", timeout, why)
}

// WaitReplicas waits until master reports at least n connected replicas,
// each with an online link.
func (set *Sentinels) WaitReplicas(master *Server, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var info string
	for time.Now().Before(deadline) {
		var err error
		info, err = redis.String(set.do(master, "INFO", "replication"))
		if err == nil && strings.Contains(info, "role:master") && strings.Count(info, "state=online") >= n {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s has not %d online replicas after %v: %s", master.Addr, n, timeout, info)
}

// WaitSynced waits until every replica master reports has acknowledged
// master's replication offset as it stands when called: every write made
// before the call is on them. (WAIT on a fresh connection would not do:
// it waits only for that connection's own writes.)
func (set *Sentinels) WaitSynced(master *Server, timeout time.Duration) error {
	info, err := redis.String(set.do(master, "INFO", "replication"))
	if err != nil {
		return err
	}
	want, ok := replOffsets(info)["master"]
	if !ok {
		return fmt.Errorf("%s reports no master_repl_offset: %s", master.Addr, info)
	}
	deadline := time.Now().Add(timeout)
	for {
		offsets := replOffsets(info)
		behind := len(offsets) == 1 // no replica at all
		for name, off := range offsets {
			if name != "master" && off < want {
				behind = true
			}
		}
		if !behind {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's replicas have not reached offset %d after %v: %s", master.Addr, want, timeout, info)
		}
		time.Sleep(20 * time.Millisecond)
		if info, err = redis.String(set.do(master, "INFO", "replication")); err != nil {
			return err
		}
	}
}

// replOffsets reads INFO replication: "master" for master_repl_offset,
// and each "slaveN" line's offset.
func replOffsets(info string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if name == "master_repl_offset" {
			if n, err := strconv.ParseInt(val, 10, 64); err == nil {
				out["master"] = n
			}
			continue
		}
		if !strings.HasPrefix(name, "slave") {
			continue
		}
		for _, kv := range strings.Split(val, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && k == "offset" {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					out[name] = n
				}
			}
		}
	}
	return out
}
