//go:build unix

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Timeouts of every connection. Reads on the blocking pool have no timeout
// of their own: the library bounds each blocking wait (at most 10s plus
// slack) with a context deadline, and a read timeout shorter than that would
// cut the wait short.
const (
	dialTimeout  = 5 * time.Second
	readTimeout  = 5 * time.Second
	writeTimeout = 5 * time.Second
	defaultURL   = "redis://127.0.0.1:6379"
	urlEnv       = "REDIS_URL"
)

// target is where and how to dial Redis.
type target struct {
	network string // "tcp" or "unix"
	addr    string
	opts    []redis.DialOption
	shown   string // the URL with its password redacted, for messages
	db      int    // the database the URL selects (0 when it names none)
	tls     bool   // rediss://
}

// resolveURL picks --redis, then $REDIS_URL, then the default.
func resolveURL(flagURL string) string {
	if flagURL != "" {
		return flagURL
	}
	if env := os.Getenv(urlEnv); env != "" {
		return env
	}
	return defaultURL
}

// parseTarget reads a Redis URL: redis:// and rediss:// with optional user,
// password and database (path "/N" or query "db=N"), or unix:///path with
// password and db in the query (or user info). A bare host:port means
// redis://host:port.
// tlsConfig is the TLS configuration --cacert and --insecure ask for.
func (c connFlags) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{InsecureSkipVerify: c.insecure, MinVersion: tls.VersionTLS12}
	if c.cacert != "" {
		pem, err := os.ReadFile(c.cacert)
		if err != nil {
			return nil, usagef("--cacert: %v", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usagef("--cacert %s: no PEM certificate in it", c.cacert)
		}
	}
	return cfg, nil
}

func parseTarget(raw string, c connFlags) (target, error) {
	if !strings.Contains(raw, "://") {
		raw = "redis://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return target{}, usagef("bad Redis URL: %v", err)
	}
	q := u.Query()
	t := target{shown: redact(u)}
	db := q.Get("db")
	password, hasPassword := q.Get("password"), q.Has("password")
	username := q.Get("username")
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			password, hasPassword, username = p, true, u.User.Username()
		} else if u.User.Username() != "" {
			// redis-cli style: a lone user-info part is the password.
			password, hasPassword = u.User.Username(), true
		}
	}
	switch u.Scheme {
	case "redis", "rediss":
		host, port := u.Hostname(), u.Port()
		if host == "" {
			host = "127.0.0.1"
		}
		if port == "" {
			port = "6379"
		}
		t.network, t.addr = "tcp", net.JoinHostPort(host, port)
		if p := strings.Trim(u.Path, "/"); p != "" {
			if db != "" && db != p {
				return target{}, usagef("bad Redis URL %s: database given twice", t.shown)
			}
			db = p
		}
	case "unix":
		if u.Path == "" {
			return target{}, usagef("bad Redis URL %s: unix:// needs a socket path, e.g. unix:///run/redis.sock", t.shown)
		}
		t.network, t.addr = "unix", u.Path
	default:
		return target{}, usagef("bad Redis URL %s: scheme must be redis, rediss or unix", t.shown)
	}
	if db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return target{}, usagef("bad Redis URL %s: database %q is not a number", t.shown, db)
		}
		t.opts = append(t.opts, redis.DialDatabase(n))
		t.db = n
	}
	if hasPassword {
		t.opts = append(t.opts, redis.DialPassword(password))
		if username != "" {
			t.opts = append(t.opts, redis.DialUsername(username))
		}
	}
	if u.Scheme == "rediss" {
		cfg, err := c.tlsConfig()
		if err != nil {
			return target{}, err
		}
		t.opts = append(t.opts, redis.DialUseTLS(true), redis.DialTLSConfig(cfg))
		t.tls = true
	} else if c.cacert != "" || c.insecure {
		return target{}, usagef("--cacert and --insecure need a rediss:// URL, got %s", t.shown)
	}
	return t, nil
}

// redact returns u with any password replaced by "xxxxx".
func redact(u *url.URL) string {
	c := *u
	if q := c.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		c.RawQuery = q.Encode()
	}
	return c.Redacted()
}

// pools are the two connection pools of one command: main for short calls
// (refresh, release, status), block for the waits of Acquire.
type pools struct {
	main, block pool
	shown       string // the URL, password redacted
}

// newPools returns the pools of t. Every connection they open has been
// through dialRedis: it reached a Redis, logged in and selected the
// database, or the pool returns a *connError that says which step failed.
func newPools(t target) *pools {
	mk := func(read time.Duration, maxIdle int) *redis.Pool {
		opts := append([]redis.DialOption{
			redis.DialConnectTimeout(dialTimeout),
			redis.DialReadTimeout(read),
			redis.DialWriteTimeout(writeTimeout),
			redis.DialTLSHandshakeTimeout(dialTimeout),
		}, t.opts...)
		return &redis.Pool{
			MaxIdle:     maxIdle,
			IdleTimeout: time.Minute,
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return dialRedis(ctx, t, opts)
			},
		}
	}
	return &pools{main: mk(readTimeout, 4), block: mk(0, 64), shown: t.shown}
}

func (p *pools) Close() {
	p.main.Close()
	p.block.Close()
}

// connect resolves the URL from the flags and the environment and returns
// the pools. A new URL scheme needs a case in parseTarget (and, if it does
// not dial one address, a dial of its own in dialRedis); the rest of the
// command sees only pools.
func connect(c connFlags) (*pools, error) {
	if p, ok, err := connectSentinel(c); ok {
		return p, err
	}
	t, err := parseTarget(resolveURL(c.url), c)
	if err != nil {
		return nil, err
	}
	return newPools(t), nil
}
