//go:build unix

package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/sentinel"
)

// pool is what a command needs of a connection pool: a redsem.Pool that can
// be closed. *redis.Pool and *sentinel.Pool are ones.
type pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
	Close() error
}

// defaultSentinelPort is the port of a sentinel address given without one.
const defaultSentinelPort = "26379"

// sentinelWait bounds how long connecting waits for the sentinels to name a
// reachable master; once connected, a command waits up to
// sentinel.DefaultFailoverWait for a failover to finish.
const sentinelWait = 10 * time.Second

// sentinelTarget is a parsed redis+sentinel:// URL.
type sentinelTarget struct {
	addrs        []string // sentinels
	master       string   // the master's name
	dataOpts     []redis.DialOption
	sentinelOpts []redis.DialOption
	shown        string // the URL with its passwords redacted
}

// isSentinelURL reports whether raw names its Redis through sentinels.
func isSentinelURL(raw string) bool {
	return strings.HasPrefix(raw, "redis+sentinel://") || strings.HasPrefix(raw, "rediss+sentinel://")
}

// connectSentinel connects through the sentinels when the URL of c is a
// sentinel URL, and reports whether it was one.
func connectSentinel(c connFlags) (*pools, bool, error) {
	raw := resolveURL(c.url)
	if !isSentinelURL(raw) {
		return nil, false, nil
	}
	t, err := parseSentinelTarget(raw, c)
	if err != nil {
		return nil, true, err
	}
	p, err := newSentinelPools(t)
	return p, true, err
}

// parseSentinelTarget reads
//
//	redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db][?options]
//
// and its TLS form rediss+sentinel:// (TLS toward the sentinels and the
// data nodes, with --cacert and --insecure). Ports default to 26379. The
// user and password of the URL are for the data nodes; the sentinels' own
// come from the query: sentinel_password and sentinel_username. The
// database may also be given as db=N.
func parseSentinelTarget(raw string, c connFlags) (sentinelTarget, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, path, _ := strings.Cut(rest, "/")
	path, query, _ := strings.Cut(path, "?")
	userinfo, hosts := "", authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, hosts = authority[:i], authority[i+1:]
	}
	// Parse the user info and query with net/url, on one placeholder host
	// (a list of hosts is not a URL host).
	probe := scheme + "://"
	if userinfo != "" {
		probe += userinfo + "@"
	}
	probe += "sentinels/" + path
	if query != "" {
		probe += "?" + query
	}
	u, err := url.Parse(probe)
	if err != nil {
		return sentinelTarget{}, usagef("bad Redis URL: %v", err)
	}
	t := sentinelTarget{}
	red := *u
	red.Host = hosts
	t.shown = redact(&red)
	if q := red.Query(); q.Has("sentinel_password") {
		q.Set("sentinel_password", "xxxxx")
		red.RawQuery = q.Encode()
		t.shown = red.Redacted()
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return sentinelTarget{}, usagef("bad Redis URL %s: empty sentinel address", t.shown)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil { // no port
			host, port = strings.Trim(h, "[]"), defaultSentinelPort
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil || host == "" {
			return sentinelTarget{}, usagef("bad Redis URL %s: bad sentinel address %q", t.shown, h)
		}
		t.addrs = append(t.addrs, net.JoinHostPort(host, port))
	}
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	if segs[0] == "" || len(segs) > 2 {
		return sentinelTarget{}, usagef("bad Redis URL %s: want redis+sentinel://host:port[,host:port...]/master-name[/db]", t.shown)
	}
	t.master = segs[0]
	q := u.Query()
	db := q.Get("db")
	if len(segs) == 2 {
		if db != "" && db != segs[1] {
			return sentinelTarget{}, usagef("bad Redis URL %s: database given twice", t.shown)
		}
		db = segs[1]
	}
	if db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return sentinelTarget{}, usagef("bad Redis URL %s: database %q is not a number", t.shown, db)
		}
		t.dataOpts = append(t.dataOpts, redis.DialDatabase(n))
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			t.dataOpts = append(t.dataOpts, redis.DialPassword(p))
			if u.User.Username() != "" {
				t.dataOpts = append(t.dataOpts, redis.DialUsername(u.User.Username()))
			}
		} else if u.User.Username() != "" {
			t.dataOpts = append(t.dataOpts, redis.DialPassword(u.User.Username()))
		}
	}
	if q.Has("sentinel_password") {
		t.sentinelOpts = append(t.sentinelOpts, redis.DialPassword(q.Get("sentinel_password")))
		if user := q.Get("sentinel_username"); user != "" {
			t.sentinelOpts = append(t.sentinelOpts, redis.DialUsername(user))
		}
	}
	if scheme == "rediss+sentinel" {
		cfg, err := c.tlsConfig()
		if err != nil {
			return sentinelTarget{}, err
		}
		tlsOpts := []redis.DialOption{redis.DialUseTLS(true), redis.DialTLSConfig(cfg), redis.DialTLSHandshakeTimeout(dialTimeout)}
		t.dataOpts = append(t.dataOpts, tlsOpts...)
		t.sentinelOpts = append(t.sentinelOpts, tlsOpts...)
	} else if c.cacert != "" || c.insecure {
		return sentinelTarget{}, usagef("--cacert and --insecure need a rediss:// or rediss+sentinel:// URL, got %s", t.shown)
	}
	return t, nil
}

// anySentinelListens returns nil once one of the sentinels accepts a TCP
// connection, else an error naming them: sentinel.New would keep asking them
// until sentinelWait, which is for a failover, not for a wrong address.
func anySentinelListens(addrs []string) error {
	var last error
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, dialTimeout)
		if err == nil {
			c.Close()
			return nil
		}
		last = err
	}
	return fmt.Errorf("no sentinel listens at %s (%v)", strings.Join(addrs, ", "), last)
}

// newSentinelPools returns the two pools of a command, each following the
// master through the sentinels.
func newSentinelPools(t sentinelTarget) (*pools, error) {
	if err := anySentinelListens(t.addrs); err != nil {
		return nil, &connError{msg: fmt.Sprintf("cannot reach Redis at %s: %v", t.shown, err), err: err}
	}
	mk := func(read time.Duration, maxIdle int) (*sentinel.Pool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), sentinelWait)
		defer cancel()
		data := append([]redis.DialOption{
			redis.DialConnectTimeout(dialTimeout),
			redis.DialReadTimeout(read),
			redis.DialWriteTimeout(writeTimeout),
		}, t.dataOpts...)
		p, err := sentinel.New(ctx, t.addrs, t.master, sentinel.WithDialOptions(data...),
			sentinel.WithSentinelDialOptions(t.sentinelOpts...), sentinel.WithPoolSize(maxIdle, 0))
		if err != nil {
			return nil, fmt.Errorf("cannot reach Redis at %s: %w", t.shown, err)
		}
		return p, nil
	}
	main, err := mk(readTimeout, 4)
	if err != nil {
		return nil, err
	}
	block, err := mk(0, 64)
	if err != nil {
		main.Close()
		return nil, err
	}
	return &pools{main: main, block: block, shown: t.shown}, nil
}
