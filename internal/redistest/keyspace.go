package redistest

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"
)

// KeyValue is one key's type and content, in a form that compares with ==:
// lists in order, hashes, sets and sorted sets sorted.
type KeyValue struct {
	Type    string
	Content string
}

// Snapshot reads every key of the database at addr (tests use a database
// of their own) with its content.
func Snapshot(t testing.TB, addr string) map[string]KeyValue {
	t.Helper()
	c, err := redis.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	names, err := redis.Strings(c.Do("KEYS", "*"))
	require.NoError(t, err)
	snap := map[string]KeyValue{}
	for _, k := range names {
		kv := readKey(t, c, k)
		if kv.Type != "none" {
			snap[k] = kv
		}
	}
	return snap
}

func readKey(t testing.TB, c redis.Conn, k string) KeyValue {
	t.Helper()
	typ, err := redis.String(c.Do("TYPE", k))
	require.NoError(t, err)
	var items []string
	switch typ {
	case "none":
		return KeyValue{Type: typ}
	case "string":
		s, err := redis.String(c.Do("GET", k))
		require.NoError(t, err)
		return KeyValue{Type: typ, Content: s}
	case "list":
		items, err = redis.Strings(c.Do("LRANGE", k, 0, -1))
		require.NoError(t, err)
		return KeyValue{Type: typ, Content: strings.Join(items, "\x00")}
	case "hash":
		m, err := redis.StringMap(c.Do("HGETALL", k))
		require.NoError(t, err)
		for f, v := range m {
			items = append(items, f+"="+v)
		}
	case "set":
		items, err = redis.Strings(c.Do("SMEMBERS", k))
		require.NoError(t, err)
	case "zset":
		m, err := redis.StringMap(c.Do("ZRANGE", k, 0, -1, "WITHSCORES"))
		require.NoError(t, err)
		for f, v := range m {
			items = append(items, f+"="+v)
		}
	default:
		t.Fatalf("key %s of type %s", k, typ)
	}
	sort.Strings(items)
	return KeyValue{Type: typ, Content: strings.Join(items, "\x00")}
}

// Write replaces key k of the database at addr with value kv (as read by
// Snapshot).
func Write(t testing.TB, addr, k string, kv KeyValue) {
	t.Helper()
	c, err := redis.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Do("DEL", k)
	require.NoError(t, err)
	if kv.Type == "none" || kv.Type == "" {
		return
	}
	items := strings.Split(kv.Content, "\x00")
	args := redis.Args{k}
	switch kv.Type {
	case "string":
		_, err = c.Do("SET", k, kv.Content)
	case "list":
		_, err = c.Do("RPUSH", args.AddFlat(items)...)
	case "set":
		_, err = c.Do("SADD", args.AddFlat(items)...)
	case "hash", "zset":
		for _, it := range items {
			f, v, _ := strings.Cut(it, "=")
			if kv.Type == "hash" {
				args = args.Add(f, v)
			} else {
				args = args.Add(v, f)
			}
		}
		cmd := map[string]string{"hash": "HSET", "zset": "ZADD"}[kv.Type]
		_, err = c.Do(cmd, args...)
	default:
		err = fmt.Errorf("no writer for type %s", kv.Type)
	}
	require.NoError(t, err)
}

// WriteStranger writes a value of type typ ("string", "list", "hash", "set"
// or "zset") under key of the database at addr, replacing what was there:
// what a stranger sharing the database might do.
func WriteStranger(t testing.TB, addr, key, typ string) {
	t.Helper()
	c, err := redis.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Do("DEL", key)
	require.NoError(t, err)
	switch typ {
	case "string":
		_, err = c.Do("SET", key, "stranger")
	case "list":
		_, err = c.Do("RPUSH", key, "stranger")
	case "hash":
		_, err = c.Do("HSET", key, "stranger", "1")
	case "set":
		_, err = c.Do("SADD", key, "stranger")
	case "zset":
		_, err = c.Do("ZADD", key, 1, "stranger")
	}
	require.NoError(t, err)
}

// Do runs one command on a fresh connection to the server at addr, failing
// the test on error.
func Do(t testing.TB, addr, cmd string, args ...interface{}) interface{} {
	t.Helper()
	c, err := redis.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	v, err := c.Do(cmd, args...)
	require.NoError(t, err, "%s %v", cmd, args)
	return v
}
